/* absent.c: the CUDA backend's entry points in a build without the CUDA toolkit (PT_CUDA=OFF, or
 * AUTO on a machine without nvcc; CMakeLists.txt compiles it only then): `training.device = cuda`
 * is refused with a message saying so. */
#include "pt/backend.h"

pt_backend *pt_backend_cuda_create(int local_rank) {
    (void)local_rank;
    pt_errorf(PT_ERR_CONFIG, "training.device = cuda: this pentatron was built without the CUDA "
              "backend (no CUDA toolkit found at build time; rebuild with -DPT_CUDA=ON and nvcc "
              "on the PATH or CUDAToolkit_ROOT set)");
    return NULL;
}
pt_backend *pt_backend_cuda_create_shared(int local_rank, int sharers) {
    (void)sharers;
    return pt_backend_cuda_create(local_rank);
}
int pt_cuda_device_count(void) { return 0; }
pt_status pt_cuda_check_usable(void) {
    pt_backend_cuda_create(0); /* its message */
    return PT_ERR_CONFIG;
}
int64_t pt_cuda_malloc_count(void) { return 0; }
double pt_cuda_peak_tflops(pt_backend *be, int bf16) {
    (void)be, (void)bf16;
    return 0;
}
int64_t pt_cuda_device_memory(pt_backend *be) {
    (void)be;
    return 0;
}
int64_t pt_cuda_memory_peak(pt_backend *be) {
    (void)be;
    return 0;
}
double pt_cuda_datasheet_tflops(pt_backend *be) {
    (void)be;
    return 0;
}
