// What the library was built against, readable without loading it.
//
// A custom-op library built against one TensorFlow release can fail to load,
// or crash, under another (TensorFlow's C++ ABI changes between releases).
// tfhvd/common/library.py therefore reads this marker from the file's bytes
// before TensorFlow loads the library, and raises an ImportError that names
// both versions and says how to rebuild.  setup.py passes the version of the
// TensorFlow it compiles against (tf.__version__) as TFHVD_TF_VERSION.

#ifndef TFHVD_TF_VERSION
#define TFHVD_TF_VERSION ""
#endif

// "tfhvd-built-against-tensorflow=" followed by the version and a NUL;
// exported (and so kept by the linker) under a C name.
extern "C" __attribute__((visibility("default"), used))
const char tfhvd_built_against_tensorflow[] = "tfhvd-built-against-tensorflow=" TFHVD_TF_VERSION;
