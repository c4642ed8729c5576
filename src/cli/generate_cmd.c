/* generate_cmd.c: `pentatron generate`, and the sample `pentatron train` prints at its end. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "pt/checkpoint.h"
#include "pt/config.h"
#include "pt/hf_config.h"
#include "pt/metrics.h"
#include "pt/tokenizer.h"
#include "train/resume.h"

pt_status pt_cli_sample(pt_model *m, const char *tokenizer, const char *prompt, int n_new,
                        const pt_gen_options *o, int flags) {
    pt_tokenizer *tok;
    PT_TRY(pt_tokenizer_open(&tok, tokenizer));
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int Tmax = m->cfg.max_seq_len, sep = pt_tokenizer_eot(tok);
    pt_status st = PT_OK;
    if (flags & PT_SAMPLE_SEPARATOR) { /* as prepare puts it before every document */
        if (sep < 0) {
            st = pt_errorf(PT_ERR_CONFIG, "%s has no document separator token to start with", tokenizer);
        } else {
            cap = 16;
            ids = pt_malloc(cap * sizeof *ids);
            ids[n++] = sep;
        }
    }
    size_t n_sep = n;
    if (st == PT_OK) st = pt_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n, &cap);
    if (st == PT_OK && n == n_sep) st = pt_errorf(PT_ERR_CONFIG, "the prompt is empty");
    if (st == PT_OK && n >= (size_t)Tmax)
        st = pt_errorf(PT_ERR_CONFIG, "the prompt is %zu tokens: model.max_seq_len = %d leaves no "
                       "room for a new one", n, Tmax);
    if (st == PT_OK && n_new > Tmax - (int)n) { /* (n + n_new could pass INT_MAX) */
        pt_log_warn("generation stops after %d new tokens: the context (prompt and new tokens) "
                    "reaches model.max_seq_len = %d and does not slide", Tmax - (int)n, Tmax);
        n_new = Tmax - (int)n;
    }
    pt_gen_stats gs = {0};
    int32_t *out = pt_malloc((size_t)(n_new > 0 ? n_new : 1) * sizeof *out);
    if (st == PT_OK) st = pt_generate(m, ids, (int)n, out, n_new, o, &gs);
    if (st == PT_OK) {
        size_t len;
        char *text = pt_tokenizer_decode(tok, out, (size_t)gs.n_new, &len);
        if (!text) st = PT_ERR_RUNTIME;
        else printf("%s%.*s\n", prompt, (int)len, text);
        fflush(stdout);
        free(text);
    }
    if (st == PT_OK && (flags & PT_SAMPLE_REPORT)) {
        /* on stderr, so that stdout is the text alone */
        fprintf(stderr, "prefill: %zu tokens in %.3f s, %.1f tokens/s\n", n, gs.prefill_s,
                gs.prefill_s > 0 ? (double)n / gs.prefill_s : 0.0);
        fprintf(stderr, "decode: %d tokens in %.3f s, %.2f tokens/s (%s)\n", gs.n_steps,
                gs.decode_s, gs.decode_s > 0 ? gs.n_steps / gs.decode_s : 0.0,
                o->no_cache ? "no cache: each a forward over the whole context" : "key/value cache");
    }
    free(out);
    free(ids);
    pt_tokenizer_free(tok);
    return st;
}

static void pt_generate_usage(FILE *f) {
    fprintf(f,
            "usage: pentatron generate (--checkpoint DIR | --model DIR) --prompt TEXT [options]\n"
            "\n"
            "Continues TEXT with a model saved by `pentatron train` (--checkpoint) or a Hugging Face\n"
            "Llama directory, config.json and safetensors weights (--model), on one process.\n"
            "Prints the text on stdout, and the prompt's (prefill) and the new tokens' (decode)\n"
            "tokens/s on stderr. The context (prompt and new tokens) is at most model.max_seq_len:\n"
            "a longer prompt is refused, and generation stops there (nothing slides).\n"
            "  --tokenizer PATH       a Hugging Face tokenizer.json, a .tiktoken file, or a directory\n"
            "                         with tokenizer.json or GPT-2's encoder.json and vocab.bpe\n"
            "                         (default: the model directory when it has one of those or a\n"
            "                         tokenizer.tiktoken, as `export` writes them, else sample.vocab\n"
            "                         of DIR/train.ini, a relative path tried from here, then from\n"
            "                         the directory training ran in); --vocab DIR is the same\n"
            "  --bos                  start with the tokenizer's document separator, as `prepare`\n"
            "                         puts before every document (<|endoftext|> for GPT-2's)\n"
            "  --max-new-tokens N     tokens to generate (default 64)\n"
            "  --temperature T        0 = greedy (default 0)\n"
            "  --top-k K              sample among the K most likely (default 0 = all)\n"
            "  --seed S               sampling seed (default 1)\n"
            "  --no-cache             no key/value cache: each token from a forward over the whole\n"
            "                         context (slow; the same tokens)\n"
            "  --precision P          fp32 (default) or bf16: weights and activations rounded to bf16,\n"
            "                         products summed in fp32, as training.precision = bf16 computes\n"
            "  --threads N            compute threads (default: all cores)\n"
            "  --device D             cpu (default) or cuda: the model, its key/value cache and\n"
            "                         the sampling's logits on one GPU (docs/gpu.md)\n");
}

static int pt_file_exists(const char *dir, const char *name) {
    char path[PT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, R_OK) == 0;
}

/* sample.vocab of dir/train.ini as a path that exists here: as recorded when absolute; when
 * relative, from the current directory, else from the directory training ran in (index.json's
 * run_dir; a checkpoint saved before it was recorded has none). 0: no sample.vocab; 1: found;
 * -1: not found, the message naming the key, what was tried and --tokenizer. */
static int pt_saved_tokenizer(const char *dir, char *path) {
    pt_config saved;
    pt_config_defaults(&saved);
    char ini[PT_PATH_MAX + 32];
    snprintf(ini, sizeof ini, "%s/train.ini", dir);
    if (access(ini, R_OK) != 0 || pt_config_load_file(&saved, ini) != PT_OK || !saved.sample.vocab[0])
        return 0;
    const char *v = saved.sample.vocab;
    if (access(v, R_OK) == 0) {
        snprintf(path, PT_PATH_MAX, "%s", v);
        return 1;
    }
    char tried[3 * PT_PATH_MAX];
    snprintf(tried, sizeof tried, "%s%s", v, v[0] == '/' ? "" : " (from the current directory)");
    json_t *index = NULL;
    const char *run_dir = NULL;
    if (v[0] != '/' && pt_resume_load_index(dir, &index) == PT_OK)
        run_dir = json_string_value(json_object_get(index, "run_dir"));
    int found = 0;
    if (run_dir) {
        char there[2 * PT_PATH_MAX + 2];
        snprintf(there, sizeof there, "%s/%s", run_dir, v);
        found = strlen(there) < PT_PATH_MAX && access(there, R_OK) == 0;
        if (found) snprintf(path, PT_PATH_MAX, "%s", there);
        size_t n = strlen(tried);
        snprintf(tried + n, sizeof tried - n, " and %s (from %s, the directory training ran in)",
                 there, run_dir);
    }
    json_decref(index);
    if (found) return 1;
    pt_errorf(PT_ERR_IO, "%s: sample.vocab = \"%s\", the tokenizer training named, is not found: "
              "tried %s; give it with --tokenizer PATH", ini, v, tried);
    return -1;
}

pt_status pt_cli_find_tokenizer(const char *dir, const char *given, char *path) {
    if (given) {
        snprintf(path, PT_PATH_MAX, "%s", given);
        return PT_OK;
    }
    if (pt_file_exists(dir, "tokenizer.json") ||
        (pt_file_exists(dir, "encoder.json") && pt_file_exists(dir, "vocab.bpe"))) {
        snprintf(path, PT_PATH_MAX, "%s", dir);
        return PT_OK;
    }
    if (pt_file_exists(dir, "tokenizer.tiktoken")) {
        snprintf(path, PT_PATH_MAX, "%s/tokenizer.tiktoken", dir);
        return PT_OK;
    }
    int saved = pt_saved_tokenizer(dir, path);
    if (saved) return saved > 0 ? PT_OK : PT_ERR_IO;
    return pt_errorf(PT_ERR_CONFIG, "no tokenizer for %s: neither tokenizer.json, tokenizer.tiktoken "
                     "nor encoder.json and vocab.bpe in it, and no train.ini naming sample.vocab; "
                     "give it with --tokenizer PATH", dir);
}

/* v as an integer in [lo, hi]: all of it digits (strtoll's end at the string's end), no overflow
 * (errno), in range; else 0. */
static int pt_parse_int(const char *v, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) return 0;
    *out = x;
    return 1;
}

/* v as a finite number >= 0 that fits a float; else 0 (nan, inf and negatives mean nothing). */
static int pt_parse_nonneg_float(const char *v, float *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !isfinite(x) || !(x >= 0) || !isfinite((float)x)) return 0;
    *out = (float)x;
    return 1;
}

int pt_cmd_generate(int argc, char **argv) {
    const char *ckpt = NULL, *model = NULL, *prompt = NULL, *tokenizer = NULL;
    int n_new = 64, threads = 0, flags = PT_SAMPLE_REPORT, bf16 = 0, cuda = 0;
    pt_gen_options o = {.seed = 1};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            pt_generate_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--no-cache") || !strcmp(a, "--bos")) {
            if (a[2] == 'n') o.no_cache = 1;
            else flags |= PT_SAMPLE_SEPARATOR;
            continue;
        }
        if (i + 1 >= argc) {
            pt_log_error("generate: %s needs a value (see --help)", a);
            return PT_EXIT_REFUSED;
        }
        const char *v = argv[++i];
        long long x = 0;
        int ok = 1; /* integers with their full range checked, floats finite and >= 0 */
        if (!strcmp(a, "--checkpoint"))
            ckpt = v;
        else if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--prompt"))
            prompt = v;
        else if (!strcmp(a, "--tokenizer") || !strcmp(a, "--vocab"))
            tokenizer = v;
        else if (!strcmp(a, "--max-new-tokens"))
            ok = pt_parse_int(v, 0, INT_MAX, &x) && (n_new = (int)x, 1);
        else if (!strcmp(a, "--temperature"))
            ok = pt_parse_nonneg_float(v, &o.temperature);
        else if (!strcmp(a, "--top-k"))
            ok = pt_parse_int(v, 0, INT_MAX, &x) && (o.top_k = (int)x, 1);
        else if (!strcmp(a, "--seed")) {
            char *end; /* all of uint64: strtoull would take "-1" as 2^64 - 1 */
            errno = 0;
            o.seed = strtoull(v, &end, 10);
            ok = *v && !*end && !errno && v[0] != '-';
        } else if (!strcmp(a, "--threads"))
            ok = pt_parse_int(v, 0, pt_max_threads(), &x) && (threads = (int)x, 1);
        else if (!strcmp(a, "--precision")) {
            bf16 = !strcmp(v, "bf16");
            ok = bf16 || !strcmp(v, "fp32");
        } else if (!strcmp(a, "--device")) {
            cuda = !strcmp(v, "cuda");
            ok = cuda || !strcmp(v, "cpu");
        }
        else {
            pt_log_error("generate: unknown option %s (see --help)", a);
            return PT_EXIT_REFUSED;
        }
        if (!ok) {
            char want[64] = "an integer in [0, 2147483647]";
            if (!strcmp(a, "--temperature")) snprintf(want, sizeof want, "a finite number >= 0");
            if (!strcmp(a, "--seed")) snprintf(want, sizeof want, "an integer in [0, 2^64)");
            if (!strcmp(a, "--precision")) snprintf(want, sizeof want, "fp32 or bf16");
            if (!strcmp(a, "--device")) snprintf(want, sizeof want, "cpu or cuda");
            if (!strcmp(a, "--threads"))
                snprintf(want, sizeof want, "an integer in [0, %d] (4 × the cores here)",
                         pt_max_threads());
            pt_log_error("generate: bad value \"%s\" for %s: expected %s", v, a, want);
            return PT_EXIT_REFUSED;
        }
    }
    if (!ckpt == !model || !prompt) {
        pt_log_error("generate: --checkpoint and --prompt are required (or --model instead of "
                     "--checkpoint, not both; see --help)");
        return PT_EXIT_REFUSED;
    }
    const char *dir = ckpt ? ckpt : model;
    const char *const paths[][2] = {{"--checkpoint", ckpt}, {"--model", model}, {"--tokenizer", tokenizer}};
    for (size_t k = 0; k < sizeof paths / sizeof *paths; k++) /* never cut short */
        if (paths[k][1] && strlen(paths[k][1]) >= PT_PATH_MAX) {
            pt_log_error("generate: %s: a path of %zu characters, longer than the %d allowed",
                         paths[k][0], strlen(paths[k][1]), PT_PATH_MAX - 1);
            return PT_EXIT_REFUSED;
        }
    char path[PT_PATH_MAX + 32], tok_path[PT_PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    pt_model_config mc;
    pt_status st = access(dir, R_OK) == 0 ? PT_OK : pt_errorf(PT_ERR_IO, "cannot read %s", dir);
    if (st == PT_OK) st = pt_hf_config_read(path, &mc);
    if (st == PT_OK) st = pt_cli_find_tokenizer(dir, tokenizer, tok_path);
    pt_backend *be = NULL;
    pt_model m = {0};
    if (st == PT_OK) st = pt_model_config_check(&mc);
    if (st == PT_OK) { /* the weights, before allocating them */
        char what[160];
        int64_t limit = pt_memory_limit(0, what, sizeof what);
        st = pt_memory_precheck(&mc, 4, 0, 1, limit, what);
    }
    if (st == PT_OK) {
        if (cuda) {
            st = pt_cuda_check_usable();
            be = st == PT_OK ? pt_backend_cuda_create(0) : NULL;
        } else {
            be = pt_backend_cpu_create(threads, PT_GEMM_ONEDNN);
        }
        if (!be && st == PT_OK) st = PT_ERR_RUNTIME;
    }
    if (st == PT_OK) st = pt_model_init_ex(&m, &mc, be, 0, PT_MODEL_NO_GRADS, NULL);
    if (st == PT_OK) st = pt_ckpt_load_weights(dir, &m);
    if (st == PT_OK && bf16) st = pt_model_set_precision(&m, PT_PREC_BF16);
    if (st == PT_OK) st = pt_cli_sample(&m, tok_path, prompt, n_new, &o, flags);
    if (st != PT_OK) pt_log_error("generate: %s", pt_last_error());
    pt_model_free(&m);
    if (be) be->destroy(be);
    /* everything it can fail on is its input (the model, the tokenizer, the prompt), but the
     * runtime's own failures */
    return pt_cli_exit(st, 0);
}
