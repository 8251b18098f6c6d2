// See libcrypto_decls.h: declarations for the device check only.
#include "openssl/libcrypto_decls.h"
