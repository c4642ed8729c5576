/* export_cmd.c: `pentatron export`: a checkpoint saved under any layout, consolidated into a
 * Hugging Face directory (config.json + model.safetensors). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "pt/checkpoint.h"
#include "pt/hf_config.h"
#include "pt/metrics.h"

static void pt_export_usage(FILE *f) {
    fprintf(f, "usage: pentatron export --checkpoint DIR --out DIR [--dtype fp32|bf16]\n"
               "\n"
               "Reads a pentatron checkpoint (written by any number of ranks, any layout) and writes\n"
               "its weights as one Hugging Face directory: config.json and model.safetensors, F32\n"
               "(the default) or BF16 (the fp32 weights rounded to nearest even; model.init_from\n"
               "reads both).\n");
}

int pt_cmd_export(int argc, char **argv) {
    const char *ckpt = NULL, *out = NULL, *dtype = "fp32";
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            pt_export_usage(stdout);
            return 0;
        }
        const char **dst = !strcmp(argv[i], "--checkpoint") ? &ckpt
                           : !strcmp(argv[i], "--out")      ? &out
                           : !strcmp(argv[i], "--dtype")    ? &dtype
                                                            : NULL;
        if (!dst || i + 1 >= argc) {
            pt_log_error("export: %s %s (see --help)", argv[i], dst ? "needs a value" : "is not an option");
            return PT_EXIT_REFUSED;
        }
        *dst = argv[++i];
    }
    if (!ckpt || !out) {
        pt_log_error("export: --checkpoint and --out are required (see --help)");
        return PT_EXIT_REFUSED;
    }
    if (strcmp(dtype, "fp32") && strcmp(dtype, "bf16")) {
        pt_log_error("export: --dtype %s: expected fp32 or bf16", dtype);
        return PT_EXIT_REFUSED;
    }
    for (int k = 0; k < 2; k++) /* never cut short: the export would land elsewhere */
        if (strlen(k ? out : ckpt) >= PT_PATH_MAX) {
            pt_log_error("export: %s: a path of %zu characters, longer than the %d allowed",
                         k ? "--out" : "--checkpoint", strlen(k ? out : ckpt), PT_PATH_MAX - 1);
            return PT_EXIT_REFUSED;
        }
    /* the outputs first: a FIFO or device there would hang the write or be replaced by it */
    char path[PT_PATH_MAX + 32], limit_what[160];
    pt_status st = pt_check_output(out, 1, "export --out");
    const char *written[] = {"config.json", "model.safetensors"};
    for (int k = 0; k < 2 && st == PT_OK; k++) {
        snprintf(path, sizeof path, "%s/%s", out, written[k]);
        st = pt_check_output(path, 0, "export --out");
    }
    snprintf(path, sizeof path, "%s/config.json", ckpt);
    pt_model_config mc;
    if (st == PT_OK) st = pt_hf_config_read(path, &mc);
    pt_model m = {0};
    m.cfg = mc;
    if (st == PT_OK) st = pt_model_config_check(&mc);
    if (st == PT_OK) { /* the host copy of the weights, before allocating it */
        int64_t limit = pt_memory_limit(0, limit_what, sizeof limit_what);
        st = pt_memory_precheck(&mc, 4, 0, 1, limit, limit_what);
    }
    float *host = NULL;
    if (st == PT_OK) {
        pt_param_table_build(&m.gtable, &mc);
        host = pt_malloc(m.gtable.total * sizeof(float));
        st = pt_ckpt_load_weights_host(ckpt, &m, host);
    }
    int started = st == PT_OK; /* inputs read: a failure from here is the write's (1) */
    if (st == PT_OK)
        st = pt_ckpt_export_hf_host(out, &m, host,
                                    strcmp(dtype, "bf16") ? PT_ST_DTYPE_F32 : PT_ST_DTYPE_BF16);
    const char *why = st == PT_OK ? pt_hf_unmapped_reason(&mc) : NULL;
    if (why)
        pt_log_warn("export: this mixture of experts has %s: no Hugging Face architecture computes "
                    "it exactly, so %s/config.json names PentatronMoeForCausalLM (model.init_from "
                    "reads it; transformers does not)", why, out);
    if (st == PT_OK) pt_log_info("exported %s to %s", ckpt, out);
    else pt_log_error("%s", pt_last_error());
    free(host);
    pt_param_table_free(&m.gtable);
    return pt_cli_exit(st, started);
}
