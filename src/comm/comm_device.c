/* comm_device.c: how a backend's device memory reaches the network (include/pt/comm.h,
 * pt_comm_set_device): the process's choice, applied to a group by pt_comm_device_attach (the
 * staging of comm_stage.c or the NCCL of comm_nccl.c, each of which passes itself on to the
 * groups split and duplicated from the group). */
#include "comm/comm_backend.h"
#include "pt/backend.h"

static const pt_device_link *pt_dev_link;
static pt_comm_device_mode pt_dev_mode = PT_COMM_HOST;

pt_status pt_comm_set_device(const pt_device_link *link, pt_comm_device_mode mode) {
    if (mode != PT_COMM_HOST && !link)
        return pt_errorf(PT_ERR_CONFIG, "comm: %s over host memory: the backend has no device "
                         "memory to hand to the network",
                         mode == PT_COMM_NCCL ? "NCCL" : "staging");
    if (mode == PT_COMM_NCCL && !pt_comm_nccl_available()) return PT_ERR_CONFIG;
    pt_dev_link = mode == PT_COMM_HOST ? NULL : link;
    pt_dev_mode = mode;
    return PT_OK;
}

pt_comm_device_mode pt_comm_device_mode_get(void) { return pt_dev_mode; }

pt_status pt_comm_device_attach(pt_comm *c) {
    switch (pt_dev_mode) {
    case PT_COMM_STAGED: return pt_comm_stage_setup(c, pt_dev_link);
    case PT_COMM_NCCL: return pt_comm_nccl_setup(c, pt_dev_link);
    case PT_COMM_HOST: break;
    }
    return PT_OK;
}

