/* comm_names.c: the comm layer's element sizes and operation names (include/pt/comm.h), a leaf
 * that the rest of the layer (comm.c, the backends, the flight recorder) and its users call. */
#include "pt/comm.h"

size_t pt_dtype_size(pt_dtype dt) {
    switch (dt) {
    case PT_DTYPE_F32:
    case PT_DTYPE_I32: return 4;
    case PT_DTYPE_F64:
    case PT_DTYPE_I64: return 8;
    case PT_DTYPE_BF16: return 2;
    }
    return 0;
}

const char *pt_comm_op_name(pt_comm_op op) {
    static const char *names[PT_COMM_OP_COUNT] = {"all-reduce", "reduce-scatter", "all-gather",
                                                  "all-to-all", "send", "recv", "broadcast",
                                                  "barrier"};
    return (int)op >= 0 && op < PT_COMM_OP_COUNT ? names[op] : "?";
}
