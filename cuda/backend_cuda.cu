/* backend_cuda.cu — the CUDA backend's first piece: probe the runtime and cuBLAS.
 * The GPU forward pass is not implemented yet; this file exists so the CUDA toolchain, cudart
 * and cuBLAS are compiled and linked by every build that finds nvcc, and so a compile error in
 * CUDA code fails CI. Nothing here claims a working GPU path. */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "../csrc/specdec.h"

extern "C" int sd_cuda_probe(int *cublas_version) {
    int v = 0;
    if (cublasGetProperty(MAJOR_VERSION, &v) == CUBLAS_STATUS_SUCCESS) {
        int minor = 0;
        cublasGetProperty(MINOR_VERSION, &minor);
        v = v * 1000 + minor;
    }
    *cublas_version = v;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky error of a machine without a driver */
        n = 0;
    }
    return n;
}
