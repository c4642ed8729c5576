/* train_cmd.c: `pentatron train` and `pentatron generate`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "pt/checkpoint.h"
#include "pt/comm.h"
#include "pt/config.h"
#include "pt/hf_config.h"
#include "pt/tokenizer.h"
#include "pt/trainer.h"

static void pt_train_usage(FILE *f) {
    fprintf(f,
            "usage: pentatron train [--config FILE] [--section.key=value | --section.key value ...]\n"
            "\n"
            "Trains a Llama-style model. Every configuration key can be set in the INI file\n"
            "([section] then key = value) and overridden on the command line, in that order.\n"
            "  --help-config   list every key with its default and meaning\n");
}

/* Prints `prompt` and its continuation. */
static pt_status pt_print_sample(pt_model *m, const char *vocab, const char *prompt, int n_new,
                                 float temperature, int top_k, uint64_t seed) {
    pt_tokenizer *tok;
    PT_TRY(pt_tokenizer_load(&tok, vocab));
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    pt_status st = pt_tokenizer_encode(tok, prompt, strlen(prompt), &ids, &n, &cap);
    if (st == PT_OK && n == 0) st = pt_errorf(PT_ERR_CONFIG, "the prompt is empty");
    if (st == PT_OK) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] >= m->cfg.vocab_size)
                st = pt_errorf(PT_ERR_CONFIG, "prompt token %d is outside the model's vocabulary (%d)",
                               ids[i], m->cfg.vocab_size);
    }
    if (st == PT_OK) {
        int32_t *out = pt_malloc((size_t)(n_new > 0 ? n_new : 1) * sizeof *out);
        pt_generate(m, ids, (int)n, out, n_new, temperature, top_k, seed);
        size_t len;
        char *text = pt_tokenizer_decode(tok, out, (size_t)n_new, &len);
        printf("%s%.*s\n", prompt, (int)len, text);
        fflush(stdout);
        free(text);
        free(out);
    }
    free(ids);
    pt_tokenizer_free(tok);
    return st;
}

int pt_cmd_train(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            pt_train_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--help-config")) {
            pt_config_print_help(stdout);
            return 0;
        }
    }
    /* every rank parses the same arguments, so a bad one is reported by rank 0 and every rank
     * exits non-zero at once, before any collective */
    int rank = 0, world = 1;
    if (pt_comm_runtime_init(&rank, &world) != PT_OK) {
        pt_log_error("%s", pt_last_error());
        return 1;
    }
    pt_log_set_rank(rank, world);
    pt_config cfg;
    pt_config_defaults(&cfg);
    if (pt_config_from_args(&cfg, argc, argv) != PT_OK) {
        if (rank == 0) pt_log_error("%s", pt_last_error());
        pt_comm_runtime_finalize();
        return 2;
    }
    pt_trainer t;
    pt_status st = pt_trainer_init(&t, &cfg);
    if (st == PT_OK) st = pt_trainer_run(&t);
    int sample = st == PT_OK && cfg.sample.prompt[0] && cfg.sample.max_new_tokens > 0;
    pt_model whole = {0};
    /* collective: the model's blocks and shards gathered into one model on rank 0 */
    if (sample) st = pt_trainer_unsplit(&t, &whole, rank == 0);
    if (sample && st == PT_OK && rank == 0) {
        if (!cfg.sample.vocab[0])
            st = pt_errorf(PT_ERR_CONFIG, "sample.prompt needs sample.vocab (the BPE directory)");
        else {
            pt_log_info("sample:");
            st = pt_print_sample(&whole, cfg.sample.vocab, cfg.sample.prompt,
                                 cfg.sample.max_new_tokens, cfg.sample.temperature,
                                 cfg.sample.top_k, cfg.training.seed);
        }
    }
    if (st != PT_OK) {
        /* a layout or config error is the same on every rank: one message, from rank 0 */
        if (rank == 0 || st != PT_ERR_CONFIG) pt_log_error("%s", pt_last_error());
        /* other failures may be one rank's own: end the whole job rather than leave peers waiting */
        if (world > 1 && st != PT_ERR_CONFIG) pt_comm_runtime_abort(1);
    }
    pt_model_free(&whole);
    pt_trainer_free(&t);
    pt_comm_runtime_finalize();
    return st == PT_OK ? 0 : 1;
}

static void pt_generate_usage(FILE *f) {
    fprintf(f,
            "usage: pentatron generate --checkpoint DIR --prompt TEXT [options]\n"
            "\n"
            "Continues TEXT with a model saved by `pentatron train` (or any Hugging Face Llama\n"
            "directory with config.json and safetensors weights).\n"
            "  --vocab DIR            encoder.json and vocab.bpe (default: sample.vocab of DIR/train.ini)\n"
            "  --max-new-tokens N     tokens to generate (default 64)\n"
            "  --temperature T        0 = greedy (default 0)\n"
            "  --top-k K              sample among the K most likely (default 0 = all)\n"
            "  --seed S               sampling seed (default 1)\n"
            "  --threads N            compute threads (default: all cores)\n");
}

int pt_cmd_generate(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = NULL, *vocab = NULL;
    int n_new = 64, top_k = 0, threads = 0;
    float temperature = 0;
    uint64_t seed = 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            pt_generate_usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            pt_log_error("generate: %s needs a value (see --help)", a);
            return 2;
        }
        const char *v = argv[++i];
        char *end = NULL;
        if (!strcmp(a, "--checkpoint"))
            ckpt = v;
        else if (!strcmp(a, "--prompt"))
            prompt = v;
        else if (!strcmp(a, "--vocab"))
            vocab = v;
        else if (!strcmp(a, "--max-new-tokens"))
            n_new = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "--temperature"))
            temperature = strtof(v, &end);
        else if (!strcmp(a, "--top-k"))
            top_k = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "--seed"))
            seed = strtoull(v, &end, 10);
        else if (!strcmp(a, "--threads"))
            threads = (int)strtol(v, &end, 10);
        else {
            pt_log_error("generate: unknown option %s (see --help)", a);
            return 2;
        }
        if (end && (*end || end == v || n_new < 0 || top_k < 0 || temperature < 0 || threads < 0)) {
            pt_log_error("generate: bad value \"%s\" for %s", v, a);
            return 2;
        }
    }
    if (!ckpt || !prompt) {
        pt_log_error("generate: --checkpoint and --prompt are required (see --help)");
        return 2;
    }
    char path[PT_PATH_MAX + 32];
    pt_config saved;
    pt_config_defaults(&saved);
    if (!vocab) {
        snprintf(path, sizeof path, "%s/train.ini", ckpt);
        if (pt_config_load_file(&saved, path) == PT_OK && saved.sample.vocab[0]) vocab = saved.sample.vocab;
    }
    if (!vocab) {
        pt_log_error("generate: no --vocab given and %s/train.ini names none", ckpt);
        return 2;
    }
    pt_model_config mc;
    snprintf(path, sizeof path, "%s/config.json", ckpt);
    pt_status st = pt_hf_config_read(path, &mc);
    pt_backend *be = NULL;
    pt_model m = {0};
    if (st == PT_OK) {
        be = pt_backend_cpu_create(threads, PT_GEMM_ONEDNN);
        if (!be) st = PT_ERR_RUNTIME;
    }
    if (st == PT_OK) st = pt_model_init(&m, &mc, be);
    if (st == PT_OK) st = pt_ckpt_load_weights(ckpt, &m);
    if (st == PT_OK) st = pt_print_sample(&m, vocab, prompt, n_new, temperature, top_k, seed);
    if (st != PT_OK) pt_log_error("%s", pt_last_error());
    pt_model_free(&m);
    if (be) be->destroy(be);
    return st == PT_OK ? 0 : 1;
}
