/* libcuda.so.1 for the sandbox's real-SGLang hosts: a CUDA driver with no device.
 *
 * The real SGLang server runs on the CPU there (SGLANG_USE_CPU_ENGINE=1, --device cpu), yet
 * it imports sgl_kernel for its Python code (kvcache/cache_move.py), and sgl_kernel's compiled
 * common_ops library links libcuda.so.1 for one symbol, cuPointerGetAttribute. No libcuda is on
 * PyPI (Debian's is in non-free), so this file satisfies the loader. Every entry point answers
 * CUDA_ERROR_NO_DEVICE (100): nothing here pretends to be a GPU. It is found only through the
 * LD_LIBRARY_PATH that group_data/sandbox_real.py sets for the server's unit.
 */
#define CUDA_ERROR_NO_DEVICE 100
#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;

EXPORT CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_ERROR_NO_DEVICE; }
EXPORT CUresult cuDriverGetVersion(int *version) { if (version) *version = 0; return CUDA_ERROR_NO_DEVICE; }
EXPORT CUresult cuDeviceGetCount(int *count) { if (count) *count = 0; return CUDA_ERROR_NO_DEVICE; }
EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr) {
    (void)data; (void)attribute; (void)ptr; return CUDA_ERROR_NO_DEVICE;
}
EXPORT CUresult cuGetErrorString(CUresult error, const char **text) {
    (void)error; if (text) *text = "no CUDA device (sandbox libcuda stub)"; return 0;
}
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **fn, int version, unsigned long long flags, int *status) {
    (void)symbol; (void)version; (void)flags; if (fn) *fn = 0; if (status) *status = 1; return CUDA_ERROR_NO_DEVICE;
}
