/* test_config.c: config files, command-line overrides and their errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pt/config.h"
#include "testutil.h"

static const char *write_ini(const char *name, const char *text) {
    static char path[600];
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void test_file_then_overrides(void **state) {
    (void)state;
    const char *path = write_ini("a.ini",
                                 "# comment\n[model]\ndim = 64 ; inline comment\nn_heads=2\n"
                                 "[data]\ntrain = \"/some where/*.bin\"\n[optimizer]\nlr = 1e-3\n"
                                 "schedule = linear\n");
    pt_config c;
    pt_config_defaults(&c);
    char *argv[] = {"--optimizer.lr=5e-4", "--config", (char *)path, "--training.steps", "7",
                    "--model.tied_embeddings=true"};
    assert_int_equal(pt_config_from_args(&c, 6, argv), PT_OK);
    assert_int_equal(c.model.dim, 64);
    assert_int_equal(c.model.n_heads, 2);
    assert_string_equal(c.data.train, "/some where/*.bin");
    assert_float_equal(c.optimizer.lr, 5e-4f, 1e-12); /* the command line wins over the file */
    assert_string_equal(c.optimizer.schedule, "linear");
    assert_int_equal(c.training.steps, 7);
    assert_int_equal(c.model.tied_embeddings, 1);
    assert_true(pt_config_was_set(&c, "model.dim"));
    assert_false(pt_config_was_set(&c, "model.ffn_dim"));
    assert_int_equal(c.model.ffn_dim, 688); /* default */
}

static void expect_error(int argc, char **argv, const char *needle) {
    pt_config c;
    pt_config_defaults(&c);
    pt_status st = pt_config_from_args(&c, argc, argv);
    if (st == PT_OK) st = pt_config_validate(&c);
    assert_int_not_equal(st, PT_OK);
    if (!strstr(pt_last_error(), needle))
        fail_msg("error \"%s\" does not mention \"%s\"", pt_last_error(), needle);
}

static void test_bad_keys_and_values_are_named(void **state) {
    (void)state;
    expect_error(1, (char *[]){"--model.dimm=3"}, "model.dimm");
    expect_error(1, (char *[]){"--training.steps=ten"}, "training.steps");
    expect_error(1, (char *[]){"--optimizer.lr=nan"}, "optimizer.lr");
    expect_error(1, (char *[]){"--optimizer.schedule=exp"}, "constant|cosine|linear");
    expect_error(1, (char *[]){"--data.shuffle=maybe"}, "data.shuffle");
    expect_error(1, (char *[]){"--model.dim"}, "needs a value");
    expect_error(1, (char *[]){"stray"}, "stray");
    expect_error(2, (char *[]){"--training.global_batch=6", "--training.micro_batch=4"},
                 "divisible");
    expect_error(1, (char *[]){"--optimizer.beta2=1"}, "optimizer.beta2");
    const char *bad = write_ini("b.ini", "[model]\ndim = 64\nbogus = 1\n");
    expect_error(2, (char *[]){"--config", (char *)bad}, "b.ini:3");
    const char *syntax = write_ini("c.ini", "[model\ndim = 64\n");
    expect_error(2, (char *[]){"--config", (char *)syntax}, "c.ini:1");
    expect_error(2, (char *[]){"--config", "/nonexistent/x.ini"}, "/nonexistent/x.ini");
}

static void test_help_lists_every_written_key(void **state) {
    (void)state;
    /* the help and the written config come from one table: every key written appears in help */
    char *help = NULL, *ini = NULL;
    size_t hl = 0, il = 0;
    FILE *f = open_memstream(&help, &hl);
    pt_config_print_help(f);
    fclose(f);
    pt_config c;
    pt_config_defaults(&c);
    f = open_memstream(&ini, &il);
    pt_config_write(&c, f);
    fclose(f);
    /* and the written config reads back to the same values */
    const char *path = write_ini("w.ini", ini);
    pt_config d;
    pt_config_defaults(&d);
    assert_int_equal(pt_config_load_file(&d, path), PT_OK);
    assert_memory_equal(&c, &d, sizeof c);
    assert_non_null(strstr(help, "optimizer.grad_clip"));
    assert_non_null(strstr(help, "checkpoint.every"));
    free(help);
    free(ini);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_then_overrides),
        cmocka_unit_test(test_bad_keys_and_values_are_named),
        cmocka_unit_test(test_help_lists_every_written_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
