/* trace_cmd.c: `pentatron trace merge DIR [--out FILE]`: the per-rank traces logging.trace wrote,
 * joined into one Chrome/Perfetto file with a process (a track) per rank; `pentatron trace why
 * DIR`: what every rank was doing when the run ended, and who held the others up (pt/flight.h). */
#include <glob.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "pt/flight.h"
#include "pt/trace.h"

static void pt_trace_usage(FILE *f) {
    fprintf(f, "usage: pentatron trace merge DIR [--out FILE]\n"
               "       pentatron trace why DIR\n"
               "\n"
               "merge: joins DIR/trace-rank*.json, which a run with logging.trace = DIR writes (one per\n"
               "rank: the steps of logging.trace_steps), into one trace with a process per rank, for\n"
               "chrome://tracing or ui.perfetto.dev. FILE defaults to DIR/trace.json.\n"
               "why: reads DIR/flight-rank*.bin, each rank's record of its last communications (kept\n"
               "up to date while the run goes, so also after a crash or a kill), and says what each\n"
               "rank was doing at the end and which rank held the others up.\n");
}

int pt_cmd_trace(int argc, char **argv) {
    if (argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
        pt_trace_usage(stdout);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[0], "why")) {
        pt_status st = pt_flight_why(argv[1], stdout);
        if (st != PT_OK) fprintf(stderr, "error: %s\n", pt_last_error());
        return pt_cli_exit(st, 0);
    }
    if (argc < 2 || strcmp(argv[0], "merge") || (argc != 2 && !(argc == 4 && !strcmp(argv[2], "--out")))) {
        pt_trace_usage(stderr);
        return PT_EXIT_REFUSED;
    }
    char out[4096], pattern[4096];
    snprintf(out, sizeof out, "%s", argc == 4 ? argv[3] : argv[1]);
    if (argc == 2) snprintf(out, sizeof out, "%s/trace.json", argv[1]);
    /* what is refused before writing anything (2): the output where a file cannot go (a FIFO
     * would hang the write), a directory without traces; then the merge itself fails (1) but on
     * a file that is not a trace (2) */
    pt_status st = pt_check_output(out, 0, "trace merge --out");
    snprintf(pattern, sizeof pattern, "%s/trace-rank*.json", argv[1]);
    glob_t g;
    int found = st == PT_OK && glob(pattern, 0, NULL, &g) == 0;
    if (found) globfree(&g);
    else if (st == PT_OK)
        st = pt_errorf(PT_ERR_IO, "trace merge: no trace-rank*.json in %s (logging.trace writes them)",
                       argv[1]);
    int started = st == PT_OK;
    if (st == PT_OK) st = pt_trace_merge(argv[1], out);
    if (st != PT_OK) {
        fprintf(stderr, "error: %s\n", pt_last_error());
        return pt_cli_exit(st, started && st != PT_ERR_FORMAT);
    }
    printf("%s\n", out);
    return 0;
}
