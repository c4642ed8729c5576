/* commands.h: the subcommands of the pentatron executable (src/cli/main.c dispatches). */
#ifndef PT_COMMANDS_H
#define PT_COMMANDS_H

#include "pt/model.h"

/* Exit statuses, one classification for every command (docs/guide.md, "Running unattended"):
 * 0 done; PT_EXIT_REFUSED (2) refused before its work started: arguments, configuration, layout,
 * input files, output paths (run again unchanged, it is refused again: `pentatron launch` does
 * not restart it); PT_EXIT_FAILED (1) failed while working: a rank or the runtime failed, a write
 * failed, training diverged (a rerun may succeed); PT_EXIT_PREEMPTED (75, pt/preempt.h) stopped
 * by a signal after saving. */
enum { PT_EXIT_FAILED = 1, PT_EXIT_REFUSED = 2 };

/* The exit status of a command that stopped with st: 0 for PT_OK; before its work started
 * (started = 0) a configuration, format or input/output error is PT_EXIT_REFUSED, a failure of
 * the runtime or of an allocation PT_EXIT_FAILED; once started, PT_EXIT_FAILED. */
static inline int pt_cli_exit(pt_status st, int started) {
    if (st == PT_OK) return 0;
    int refused = st == PT_ERR_CONFIG || st == PT_ERR_FORMAT || st == PT_ERR_IO;
    return !started && refused ? PT_EXIT_REFUSED : PT_EXIT_FAILED;
}

int pt_cmd_train(int argc, char **argv);
int pt_cmd_generate(int argc, char **argv);
int pt_cmd_prepare(int argc, char **argv);
int pt_cmd_export(int argc, char **argv);
int pt_cmd_schedule(int argc, char **argv);
int pt_cmd_launch(int argc, char **argv);
int pt_cmd_trace(int argc, char **argv);
int pt_cmd_plan(int argc, char **argv);
int pt_cmd_report(int argc, char **argv);

/* Tokenizes prompt with the tokenizer at path tokenizer (anything pt_tokenizer_open reads),
 * continues it by n_new tokens (fewer, with a warning, where the context would pass
 * model.max_seq_len) and prints the text on stdout (src/cli/generate_cmd.c). flags:
 * PT_SAMPLE_SEPARATOR starts the tokens with the tokenizer's document separator, PT_SAMPLE_REPORT
 * prints the prefill and decode tokens/s on stderr. */
enum { PT_SAMPLE_SEPARATOR = 1, PT_SAMPLE_REPORT = 2 };
pt_status pt_cli_sample(pt_model *m, const char *tokenizer, const char *prompt, int n_new,
                        const pt_gen_options *o, int flags);

/* The tokenizer of the model in dir, into path (room for PT_PATH_MAX): `given` (--tokenizer) if
 * not NULL, else the directory's own (tokenizer.json, GPT-2's encoder.json and vocab.bpe, or
 * tokenizer.tiktoken), else sample.vocab of its train.ini, a relative one found from the current
 * directory or from the one training ran in (src/cli/generate_cmd.c). PT_ERR_IO when train.ini
 * names one that is not found, PT_ERR_CONFIG when nothing names one; the message names the key,
 * what was tried, and --tokenizer. */
pt_status pt_cli_find_tokenizer(const char *dir, const char *given, char *path);

#endif
