/* commands.h: the subcommands of the pentatron executable (src/cli/main.c dispatches). */
#ifndef PT_COMMANDS_H
#define PT_COMMANDS_H

int pt_cmd_train(int argc, char **argv);
int pt_cmd_generate(int argc, char **argv);
int pt_cmd_prepare(int argc, char **argv);
int pt_cmd_export(int argc, char **argv);
int pt_cmd_schedule(int argc, char **argv);

#endif
