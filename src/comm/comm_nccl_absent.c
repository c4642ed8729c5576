/* comm_nccl_absent.c: the NCCL comm backend's entry points in a build without NCCL's header
 * (no CUDA toolkit, or one without nccl.h; CMakeLists.txt compiles this file only then):
 * `comm.backend = nccl` is refused with a message saying so. */
#include "pt/comm.h"

int pt_comm_nccl_available(void) {
    pt_errorf(PT_ERR_CONFIG, "comm.backend = nccl: this pentatron was built without NCCL (no "
              "nccl.h at build time: build with the CUDA toolkit, or set PT_NCCL_INCLUDE to the "
              "folder of NCCL's nccl.h)");
    return 0;
}

pt_status pt_comm_nccl_setup(pt_comm *c, const struct pt_device_link *link) {
    (void)c, (void)link;
    pt_comm_nccl_available();
    return PT_ERR_CONFIG;
}
