/* train_cmd.c: `pentatron train`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "pt/comm.h"
#include "pt/config.h"
#include "pt/trainer.h"

static void pt_train_usage(FILE *f) {
    fprintf(f,
            "usage: pentatron train [--config FILE] [--section.key=value | --section.key value ...]\n"
            "\n"
            "Trains a Llama-style model. Every configuration key can be set in the INI file\n"
            "([section] then key = value) and overridden on the command line, in that order.\n"
            "  --help-config   list every key with its default and meaning\n");
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
            pt_gen_options o = {.temperature = cfg.sample.temperature,
                                .top_k = cfg.sample.top_k,
                                .seed = cfg.training.seed};
            st = pt_cli_sample(&whole, cfg.sample.vocab, cfg.sample.prompt,
                               cfg.sample.max_new_tokens, &o, 0);
        }
    }
    if (st != PT_OK) {
        /* a layout or config error, a divergence, is the same on every rank: one message, from
         * rank 0 */
        if (rank == 0 || !pt_status_agreed(st)) pt_log_error("%s", pt_last_error());
        /* other failures may be one rank's own: end the whole job rather than leave peers waiting */
        if (world > 1 && !pt_status_agreed(st)) pt_comm_runtime_abort(1);
    }
    pt_model_free(&whole);
    pt_trainer_free(&t);
    pt_comm_runtime_finalize();
    return st == PT_OK ? 0 : 1;
}
