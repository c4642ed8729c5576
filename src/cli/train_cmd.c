/* train_cmd.c: `pentatron train`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "pt/comm.h"
#include "pt/config.h"
#include "pt/preempt.h"
#include "pt/trainer.h"

static void pt_train_usage(FILE *f) {
    fprintf(f,
            "usage: pentatron train [--config FILE] [--section.key=value | --section.key value ...]\n"
            "\n"
            "Trains a Llama-style model. Every configuration key can be set in the INI file\n"
            "([section] then key = value) and overridden on the command line, in that order.\n"
            "  --help-config   list every key with its default and meaning\n"
            "\n"
            "SIGTERM, SIGINT or SIGUSR1 on any rank ends the run after the current step: every\n"
            "rank saves a checkpoint (checkpoint.dir) and exits with %d (preempted; a second\n"
            "signal exits at once). Under Open MPI's mpirun, give the ranks time to save after\n"
            "SIGTERM with --mca odls_base_sigkill_timeout SECONDS (SIGUSR1 is forwarded as is).\n"
            "\n"
            "Exit status (mpirun passes it on):\n"
            "  0   done\n"
            "  %d   failed while training (a rank or the runtime failed, a write failed, the loss\n"
            "      diverged), or the distributed runtime did not start: a rerun may succeed\n"
            "  %d   refused before training started: the configuration, the layout, an input\n"
            "      file (data, checkpoint, model.init_from) or an output path; the same command\n"
            "      is refused again (pentatron launch does not restart it)\n"
            "  %d  preempted: a signal stopped it after saving a checkpoint\n",
            PT_EXIT_PREEMPTED, PT_EXIT_FAILED, PT_EXIT_REFUSED, PT_EXIT_PREEMPTED);
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
        return PT_EXIT_FAILED;
    }
    pt_log_set_rank(rank, world);
    pt_preempt_install(rank);
    pt_config cfg;
    pt_config_defaults(&cfg);
    if (pt_config_from_args(&cfg, argc, argv) != PT_OK) {
        if (rank == 0) pt_log_error("%s", pt_last_error());
        pt_comm_runtime_finalize();
        return PT_EXIT_REFUSED;
    }
    pt_trainer t;
    pt_status st = pt_trainer_init(&t, &cfg);
    int started = st == PT_OK; /* from here a failure is one while training: 1, never 2 */
    if (st == PT_OK) st = pt_trainer_run(&t);
    int sample = st == PT_OK && !t.preempted && cfg.sample.prompt[0] &&
                 cfg.sample.max_new_tokens > 0;
    pt_model whole = {0};
    /* collective: the model's blocks and shards gathered into one model on rank 0 */
    if (sample) st = pt_trainer_unsplit(&t, &whole, rank == 0);
    if (sample && st == PT_OK && rank == 0) { /* (sample.vocab is checked with the config) */
        pt_log_info("sample:");
        pt_gen_options o = {.temperature = cfg.sample.temperature,
                            .top_k = cfg.sample.top_k,
                            .seed = cfg.training.seed};
        st = pt_cli_sample(&whole, cfg.sample.vocab, cfg.sample.prompt, cfg.sample.max_new_tokens,
                           &o, 0);
    }
    int code = pt_cli_exit(st, started);
    if (st != PT_OK) {
        /* a layout or config error, a divergence, is the same on every rank: one message, from
         * rank 0 */
        if (rank == 0 || !pt_status_agreed(st)) pt_log_error("%s", pt_last_error());
        /* other failures may be one rank's own: end the whole job rather than leave peers
         * waiting, with the status this rank would exit with (mpirun passes it on) */
        if (world > 1 && !pt_status_agreed(st)) pt_comm_runtime_abort(code);
    }
    int preempted = st == PT_OK && t.preempted;
    pt_model_free(&whole);
    pt_trainer_free(&t);
    /* preempted: the checkpoint is on disk and every rank has agreed; no MPI_Finalize, whose
     * exchange with the launcher would wait for ever once mpirun ends the job (after SIGTERM it
     * no longer answers): each rank exits with the code itself */
    if (preempted) exit(PT_EXIT_PREEMPTED);
    pt_comm_runtime_finalize();
    return code;
}
