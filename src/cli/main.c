/* main.c: `pentatron COMMAND ...`: dispatch to the subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "pt/plan.h"

static void pt_usage(FILE *f) {
    fprintf(f,
            "usage: pentatron COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  train     train a model:  pentatron train [--config FILE] [--section.key=value ...]\n"
            "  generate  continue a prompt:  pentatron generate --checkpoint DIR --prompt TEXT\n"
            "  export    a checkpoint (any layout) as a Hugging Face directory:\n"
            "            pentatron export --checkpoint DIR --out DIR\n"
            "  prepare   tokenize text or JSON Lines (gzip, zstd, - for stdin) into shards:\n"
            "            pentatron prepare --vocab DIR --out DIR [--val-fraction F] FILE...\n"
            "  schedule  check, simulate and draw a pipeline schedule:  pentatron schedule --pp 4 --schedule zb\n"
            "  launch    run a job and restart it from its newest checkpoint after a failure:\n"
            "            pentatron launch --restarts 3 -- mpirun -np 8 pentatron train ...\n"
            "  trace     join the per-rank traces of logging.trace:  pentatron trace merge DIR\n"
            "  plan      memory and step time of a layout on a cluster, or the best layouts:\n"
            "            pentatron plan --config FILE --hardware hardware/h100_sxm.ini [--search]\n"
            "  report    a run as one HTML page (curves, memory, communication, schedule):\n"
            "            pentatron report out/demo\n"
            "\n"
            "`pentatron COMMAND --help` describes each; `pentatron train --help-config` lists every\n"
            "configuration key.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        pt_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "plan") && argc > 2 && !strcmp(argv[2], "--measure"))
        return pt_plan_measure_cmd(argc - 2, argv + 2);
    if (!strcmp(cmd, "train")) return pt_cmd_train(argc - 2, argv + 2);
    if (!strcmp(cmd, "generate")) return pt_cmd_generate(argc - 2, argv + 2);
    if (!strcmp(cmd, "export")) return pt_cmd_export(argc - 2, argv + 2);
    if (!strcmp(cmd, "prepare")) return pt_cmd_prepare(argc - 2, argv + 2);
    if (!strcmp(cmd, "schedule")) return pt_cmd_schedule(argc - 2, argv + 2);
    if (!strcmp(cmd, "launch")) return pt_cmd_launch(argc - 2, argv + 2);
    if (!strcmp(cmd, "trace")) return pt_cmd_trace(argc - 2, argv + 2);
    if (!strcmp(cmd, "plan")) return pt_cmd_plan(argc - 2, argv + 2);
    if (!strcmp(cmd, "report")) return pt_cmd_report(argc - 2, argv + 2);
    fprintf(stderr, "pentatron: unknown command \"%s\"\n\n", cmd);
    pt_usage(stderr);
    return 2;
}
