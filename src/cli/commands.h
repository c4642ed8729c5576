/* commands.h: the subcommands of the pentatron executable (src/cli/main.c dispatches). */
#ifndef PT_COMMANDS_H
#define PT_COMMANDS_H

#include "pt/model.h"

int pt_cmd_train(int argc, char **argv);
int pt_cmd_generate(int argc, char **argv);
int pt_cmd_prepare(int argc, char **argv);
int pt_cmd_export(int argc, char **argv);
int pt_cmd_schedule(int argc, char **argv);
int pt_cmd_launch(int argc, char **argv);
int pt_cmd_trace(int argc, char **argv);
int pt_cmd_plan(int argc, char **argv);

/* Tokenizes prompt with the tokenizer at path tokenizer (anything pt_tokenizer_open reads),
 * continues it by n_new tokens (fewer, with a warning, where the context would pass
 * model.max_seq_len) and prints the text on stdout (src/cli/generate_cmd.c). flags:
 * PT_SAMPLE_SEPARATOR starts the tokens with the tokenizer's document separator, PT_SAMPLE_REPORT
 * prints the prefill and decode tokens/s on stderr. */
enum { PT_SAMPLE_SEPARATOR = 1, PT_SAMPLE_REPORT = 2 };
pt_status pt_cli_sample(pt_model *m, const char *tokenizer, const char *prompt, int n_new,
                        const pt_gen_options *o, int flags);

#endif
