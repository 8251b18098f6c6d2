// Host emulation of CUDA's cuda_bf16.h: the types live with the rest (cuda_runtime.h).
#include "cuda_runtime.h"
