/* export_cmd.c: `pentatron export`: a checkpoint saved under any layout, consolidated into a
 * Hugging Face directory (config.json + model.safetensors) with its tokenizer beside it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/commands.h"
#include "pt/checkpoint.h"
#include "pt/hf_config.h"
#include "pt/metrics.h"
#include "pt/tokenizer.h"

static void pt_export_usage(FILE *f) {
    fprintf(f, "usage: pentatron export --checkpoint DIR --out DIR [--dtype fp32|bf16] "
               "[--tokenizer PATH]\n"
               "\n"
               "Reads a pentatron checkpoint (written by any number of ranks, any layout) and writes\n"
               "its weights as one Hugging Face directory: config.json and model.safetensors, F32\n"
               "(the default) or BF16 (the fp32 weights rounded to nearest even; model.init_from\n"
               "reads both), and a copy of its tokenizer, so that `generate --model DIR` needs\n"
               "nothing else: tokenizer.json, GPT-2's encoder.json and vocab.bpe, or a .tiktoken\n"
               "file as tokenizer.tiktoken.\n"
               "  --tokenizer PATH   the tokenizer to copy (as generate's --tokenizer; default: the\n"
               "                     checkpoint's train.ini's sample.vocab, a relative path tried\n"
               "                     from here, then from the directory training ran in)\n");
}

/* The tokenizer's files, read whole, and where they go in the export: tokenizer.json (a
 * directory's, or a file of any other name but .tiktoken), GPT-2's encoder.json and vocab.bpe,
 * or a .tiktoken file as tokenizer.tiktoken (the names generate --model looks for). */
typedef struct {
    int n;
    char dst[2][PT_PATH_MAX + 32];
    char *data[2];
    size_t len[2];
} pt_tok_copy;

static void pt_tok_copy_free(pt_tok_copy *c) {
    for (int k = 0; k < c->n; k++) free(c->data[k]);
    c->n = 0;
}

static pt_status pt_tok_copy_read(pt_tok_copy *c, const char *tok, const char *out) {
    pt_tokenizer *t; /* a tokenizer pentatron reads, or its message */
    PT_TRY(pt_tokenizer_open(&t, tok));
    pt_tokenizer_free(t);
    struct stat sb;
    char src[2][PT_PATH_MAX + 32];
    const char *name[2];
    size_t len = strlen(tok);
    if (stat(tok, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(src[0], sizeof src[0], "%s/tokenizer.json", tok);
        c->n = access(src[0], F_OK) == 0 ? 1 : 2;
        name[0] = c->n == 1 ? "tokenizer.json" : "encoder.json";
        name[1] = "vocab.bpe";
        for (int k = 0; k < c->n; k++) snprintf(src[k], sizeof src[k], "%s/%s", tok, name[k]);
    } else {
        c->n = 1;
        name[0] = len > 9 && !strcmp(tok + len - 9, ".tiktoken") ? "tokenizer.tiktoken"
                                                                 : "tokenizer.json";
        snprintf(src[0], sizeof src[0], "%s", tok);
    }
    pt_status st = PT_OK;
    for (int k = 0; k < c->n; k++) {
        snprintf(c->dst[k], sizeof c->dst[k], "%s/%s", out, name[k]);
        c->data[k] = NULL;
        if (st == PT_OK) st = pt_check_output(c->dst[k], 0, "export --out");
        if (st == PT_OK) st = pt_read_file(src[k], &c->data[k], &c->len[k]);
    }
    return st;
}

int pt_cmd_export(int argc, char **argv) {
    const char *ckpt = NULL, *out = NULL, *dtype = "fp32", *tokenizer = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            pt_export_usage(stdout);
            return 0;
        }
        const char **dst = !strcmp(argv[i], "--checkpoint") ? &ckpt
                           : !strcmp(argv[i], "--out")      ? &out
                           : !strcmp(argv[i], "--dtype")    ? &dtype
                           : !strcmp(argv[i], "--tokenizer") ? &tokenizer
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
    const char *const paths[][2] = {{"--checkpoint", ckpt}, {"--out", out}, {"--tokenizer", tokenizer}};
    for (int k = 0; k < 3; k++) /* never cut short: the export would land elsewhere */
        if (paths[k][1] && strlen(paths[k][1]) >= PT_PATH_MAX) {
            pt_log_error("export: %s: a path of %zu characters, longer than the %d allowed",
                         paths[k][0], strlen(paths[k][1]), PT_PATH_MAX - 1);
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
    /* the tokenizer, read before anything is written */
    char tok_path[PT_PATH_MAX];
    pt_tok_copy copy = {0};
    if (st == PT_OK) st = pt_cli_find_tokenizer(ckpt, tokenizer, tok_path);
    if (st == PT_ERR_CONFIG && !tokenizer) { /* none named: the weights alone, said */
        pt_log_warn("export: %s; %s gets no tokenizer (generate --model needs --tokenizer)",
                    pt_last_error(), out);
        st = PT_OK;
        tok_path[0] = 0;
    }
    if (st == PT_OK && tok_path[0]) st = pt_tok_copy_read(&copy, tok_path, out);
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
    for (int k = 0; k < copy.n && st == PT_OK; k++)
        st = pt_write_file_atomic(copy.dst[k], copy.data[k], copy.len[k]);
    const char *why = st == PT_OK ? pt_hf_unmapped_reason(&mc) : NULL;
    if (why)
        pt_log_warn("export: this mixture of experts has %s: no Hugging Face architecture computes "
                    "it exactly, so %s/config.json names PentatronMoeForCausalLM (model.init_from "
                    "reads it; transformers does not)", why, out);
    if (st == PT_OK)
        pt_log_info("exported %s to %s%s%s", ckpt, out, copy.n ? " with the tokenizer of " : "",
                    copy.n ? tok_path : "");
    else pt_log_error("%s", pt_last_error());
    free(host);
    pt_tok_copy_free(&copy);
    pt_param_table_free(&m.gtable);
    return pt_cli_exit(st, started);
}
