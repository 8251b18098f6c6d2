// The few libcrypto functions tfhvd_ops/core/auth.cc calls, declared for the
// device check on a GPU machine that has OpenSSL 3's runtime (libcrypto.so.3,
// which Python's ssl module needs) but not its headers, and no package
// registry to install them.  Only the harness build puts this folder on the
// include path (tests/gpu/device_check.sh); the shipped library is always
// compiled against the real headers.  These are OpenSSL's stable C ABI.
#ifndef TFHVD_TESTS_GPU_LIBCRYPTO_DECLS_H_
#define TFHVD_TESTS_GPU_LIBCRYPTO_DECLS_H_

#include <stddef.h>

#define EVP_MAX_MD_SIZE 64
#define SHA256_DIGEST_LENGTH 32

extern "C" {
typedef struct evp_md_st EVP_MD;
const EVP_MD* EVP_sha256(void);
unsigned char* HMAC(const EVP_MD* evp_md, const void* key, int key_len, const unsigned char* data,
                    size_t data_len, unsigned char* md, unsigned int* md_len);
unsigned char* SHA256(const unsigned char* data, size_t count, unsigned char* md);
}

#endif  // TFHVD_TESTS_GPU_LIBCRYPTO_DECLS_H_
