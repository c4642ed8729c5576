/* test_hostile.c: hostile sizes and inputs get one clear error, never a crash, a hang, a wrapped
 * value or a silent truncation (the unit-level half; tests/test_hostile_cli.sh runs the command line,
 * tests/test_hostile_asan.sh this file under AddressSanitizer and UndefinedBehaviorSanitizer). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pt/checkpoint.h"
#include "pt/config.h"
#include "pt/data.h"
#include "pt/metrics.h"
#include "pt/safetensors.h"
#include "pt/trace.h"
#include "testutil.h"

/* Fails the test unless the last error contains needle. */
static void expect_msg(const char *needle) {
    if (!strstr(pt_last_error(), needle))
        fail_msg("expected a message containing \"%s\", got \"%s\"", needle, pt_last_error());
}

/* A value longer than its key's buffer is refused, naming the key; one that fits is kept whole
 * (data.sources holds 4 KiB: it was cut at 1,023 characters). */
static void test_config_long_values_refused_not_truncated(void **state) {
    (void)state;
    pt_config c;
    pt_config_defaults(&c);
    char *v = malloc(3000);
    memset(v, 'a', 2999);
    v[0] = '/', v[1100] = 0;
    assert_int_equal(pt_config_set(&c, "checkpoint.dir", v), PT_ERR_CONFIG);
    expect_msg("checkpoint.dir: value of 1100 characters, longer than the 1023 allowed");
    assert_string_equal(c.checkpoint.dir, ""); /* untouched */
    v[1024] = 0;
    assert_int_equal(pt_config_set(&c, "checkpoint.dir", v), PT_ERR_CONFIG);
    v[1023] = 0;
    assert_int_equal(pt_config_set(&c, "checkpoint.dir", v), PT_OK);
    assert_int_equal(strlen(c.checkpoint.dir), 1023);
    memset(v, 'a', 2999);
    memcpy(v, "w=", 2);
    v[2999] = 0;
    assert_int_equal(pt_config_set(&c, "data.sources", v), PT_OK);
    assert_int_equal(strlen(c.data.sources), 2999);
    free(v);
}

/* A float key takes what its float can hold: 1e39 is finite as a double, infinite as a float. */
static void test_config_float_beyond_float_refused(void **state) {
    (void)state;
    pt_config c;
    pt_config_defaults(&c);
    assert_int_equal(pt_config_set(&c, "optimizer.lr", "1e39"), PT_ERR_CONFIG);
    expect_msg("optimizer.lr: 1e39 is beyond a float's range");
    assert_int_equal(pt_config_set(&c, "optimizer.lr", "-1e39"), PT_ERR_CONFIG);
    assert_int_equal(pt_config_set(&c, "optimizer.lr", "nan"), PT_ERR_CONFIG);
    assert_int_equal(pt_config_set(&c, "optimizer.lr", "3e38"), PT_OK);
    assert_int_equal(pt_config_set(&c, "training.seq_len", "4294967299"), PT_ERR_CONFIG);
}

static void test_config_threads_bounded(void **state) {
    (void)state;
    pt_config c;
    pt_config_defaults(&c);
    assert_int_equal(pt_config_set(&c, "data.train", "x"), PT_OK);
    assert_int_equal(pt_config_set(&c, "training.threads", "100000"), PT_OK);
    assert_int_equal(pt_config_validate(&c), PT_ERR_CONFIG);
    expect_msg("training.threads = 100000: at most");
    char n[16];
    snprintf(n, sizeof n, "%d", pt_max_threads());
    assert_int_equal(pt_config_set(&c, "training.threads", n), PT_OK);
    assert_int_equal(pt_config_validate(&c), PT_OK);
}

/* --config naming a directory (read as empty), /dev/zero (never ends) or a FIFO (blocks in open):
 * refused at once, naming the kind. alarm: a hang fails instead of blocking the suite. */
static void test_config_file_must_be_regular(void **state) {
    (void)state;
    char fifo[600];
    snprintf(fifo, sizeof fifo, "%s/cfg.fifo", tu_tmpdir());
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(20);
    pt_config c;
    pt_config_defaults(&c);
    assert_int_equal(pt_config_load_file(&c, tu_tmpdir()), PT_ERR_IO);
    expect_msg("the config file is a directory, not a regular file");
    assert_int_equal(pt_config_load_file(&c, "/dev/zero"), PT_ERR_IO);
    expect_msg("/dev/zero: the config file is a device");
    assert_int_equal(pt_config_load_file(&c, fifo), PT_ERR_IO);
    expect_msg("the config file is a FIFO");
    alarm(0);
}

static void write_shard(const char *path, size_t n) {
    uint16_t *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++) t[i] = (uint16_t)(i % 97);
    assert_int_equal(pt_shard_write(path, t, n), PT_OK);
    free(t);
}

static void test_fifo_shard_refused(void **state) {
    (void)state;
    char dir[600], path[700], glob[700];
    snprintf(dir, sizeof dir, "%s/fifo_shard", tu_tmpdir());
    pt_mkdirs(dir);
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    snprintf(glob, sizeof glob, "%s/train_*.bin", dir);
    alarm(20);
    pt_data d;
    assert_int_equal(pt_data_open(&d, glob, 8, 0, 1, 97), PT_ERR_IO);
    expect_msg("the shard is a FIFO, not a regular file");
    alarm(0);
}

/* A shard truncated while mapped: the read that reaches past its new end exits with status 1
 * and one line naming the shard, not SIGBUS (in a child, since that is the process's end). */
static void test_truncated_shard_named_not_sigbus(void **state) {
    (void)state;
    char dir[600], path[700], glob[700], err[700];
    snprintf(dir, sizeof dir, "%s/trunc", tu_tmpdir());
    pt_mkdirs(dir);
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    snprintf(glob, sizeof glob, "%s/train_*.bin", dir);
    snprintf(err, sizeof err, "%s/child.err", dir);
    write_shard(path, 100000);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen(err, "w", stderr)) _exit(3);
        pt_data d;
        if (pt_data_open(&d, glob, 64, 0, 1, 97) != PT_OK) _exit(4);
        if (truncate(path, 1024) != 0) _exit(5); /* the header alone is left */
        int32_t in[64], tg[64];
        pt_data_read_row(&d, d.n_rows - 1, in, tg);
        _exit(0); /* not reached */
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    char *text;
    size_t len;
    assert_int_equal(pt_read_file(err, &text, &len), PT_OK);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 1 || !strstr(text, path) ||
        !strstr(text, "the shard was truncated while the run reads it"))
        fail_msg("child: %s %d; stderr: %s", WIFEXITED(status) ? "exit" : "signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), text);
    free(text);
}

/* A table of one 4 × 3 tensor, and a checkpoint directory whose index.json is given. */
static pt_param_table one_tensor(void) {
    pt_param_table t = {0};
    t.n = 1;
    t.p = calloc(1, sizeof *t.p);
    snprintf(t.p[0].name, sizeof t.p[0].name, "w");
    t.p[0].ndim = 2, t.p[0].shape[0] = 4, t.p[0].shape[1] = 3, t.p[0].numel = 12;
    t.total = 12;
    return t;
}

static pt_status open_index(const char *name, const char *step, const char *blocks) {
    char dir[600], path[700], text[1024];
    snprintf(dir, sizeof dir, "%s/%s", tu_tmpdir(), name);
    pt_mkdirs(dir);
    snprintf(path, sizeof path, "%s/index.json", dir);
    snprintf(text, sizeof text,
             "{\"format\": \"pentatron-checkpoint-2\", %s, \"tensors\": [{\"name\": \"w\", "
             "\"shape\": [4, 3], \"offset\": 0}], \"shards\": [{\"file\": \"s.safetensors\", "
             "\"crc32\": \"0\", \"blocks\": [%s]}]}", step, blocks);
    tu_write_file(path, text, strlen(text));
    pt_param_table t = one_tensor();
    pt_ckpt *c = NULL;
    pt_status st = pt_ckpt_open(&c, dir, &t);
    pt_ckpt_close(c);
    free(t.p);
    return st;
}

static void test_checkpoint_index_negative_step_refused(void **state) {
    (void)state;
    assert_int_equal(open_index("good", "\"step\": 5, \"optimizer_step\": 5", "[0, 0, 4, 0, 3]"),
                     PT_OK);
    assert_int_equal(open_index("neg", "\"step\": -5, \"optimizer_step\": -5", "[0, 0, 4, 0, 3]"),
                     PT_ERR_FORMAT);
    expect_msg("step -5 and optimizer_step -5: expected 0 <= optimizer_step <= step");
    assert_int_equal(open_index("neg2", "\"step\": 5, \"optimizer_step\": -1", "[0, 0, 4, 0, 3]"),
                     PT_ERR_FORMAT);
}

/* Block bounds whose area overflows int64 (UBSan: signed overflow in the area's sum), and blocks
 * whose areas add past the tensor's size: refused as not covering it. */
static void test_checkpoint_index_block_overflow_refused(void **state) {
    (void)state;
    const char *step = "\"step\": 1, \"optimizer_step\": 1";
    assert_int_equal(open_index("ovf1", step, "[0, -9223372036854775807, 4, 0, 3]"), PT_ERR_FORMAT);
    expect_msg("do not cover the model exactly once");
    assert_int_equal(open_index("ovf2", step, "[0, 0, 9223372036854775807, 0, 9223372036854775807]"),
                     PT_ERR_FORMAT);
    assert_int_equal(open_index("ovf3", step, "[0, 0, 4, 0, 3], [0, 0, 4, 0, 3]"), PT_ERR_FORMAT);
}

/* Sizes from the configuration, in double before anything is allocated: a product that would wrap
 * 64 bits, and a model beyond the limit, each with a message giving the need and the limit. */
static void test_memory_precheck_overflow_and_limit(void **state) {
    (void)state;
    pt_config c;
    pt_config_defaults(&c);
    pt_model_config m = c.model;
    assert_int_equal(pt_memory_precheck(&m, 16, 2048, 1, INT64_MAX, "the limit"), PT_OK);
    m.dim = 2000000000, m.n_heads = 2, m.n_kv_heads = 2;
    assert_int_equal(pt_memory_precheck(&m, 16, 2048, 1, INT64_MAX, "the limit"), PT_ERR_CONFIG);
    expect_msg("the model's sizes overflow");
    m = c.model;
    m.dim = 65536, m.ffn_dim = 65536, m.n_heads = 2, m.n_kv_heads = 2;
    assert_int_equal(pt_memory_precheck(&m, 16, 16, 1, (int64_t)1 << 30, "the limit"),
                     PT_ERR_CONFIG);
    expect_msg("needs at least");
    expect_msg("but the limit is 1.0 GiB");
}

/* A metrics line that cannot be written (a full disk: the stream swapped for /dev/full's) is an
 * error naming the file; a device as logging.metrics is refused when it is opened. */
static void test_metrics_write_error_reported(void **state) {
    (void)state;
    pt_metrics mx;
    char path[700];
    snprintf(path, sizeof path, "%s/m.jsonl", tu_tmpdir());
    assert_int_equal(pt_metrics_open(&mx, path, NULL, 10, 1), PT_OK);
    fclose(mx.f);
    mx.f = fopen("/dev/full", "w");
    assert_non_null(mx.f);
    pt_step_stats s = {.step = 1, .loss = 1.0};
    pt_config c;
    pt_config_defaults(&c);
    pt_rank_memory mem = {0};
    assert_int_equal(pt_metrics_write(&mx, &s, NULL, &c.model, &mem), PT_ERR_IO);
    expect_msg("m.jsonl failed at step 1: No space left on device");
    pt_metrics_close(&mx);
    assert_int_equal(pt_metrics_open(&mx, "/dev/full", NULL, 10, 1), PT_ERR_IO);
    expect_msg("logging.metrics: /dev/full is a device, not a regular file");
}

/* checkpoint.dir and logging.metrics are probed before the first step; a directory under a
 * regular file cannot be (the tests run as root, for whom permissions do not refuse). */
static void test_writable_dir_probe(void **state) {
    (void)state;
    char dir[700], file[600];
    snprintf(dir, sizeof dir, "%s/probe/ck", tu_tmpdir());
    assert_int_equal(pt_check_writable_dir(dir, "checkpoint.dir"), PT_OK);
    struct stat sb;
    assert_int_equal(stat(dir, &sb), 0); /* made, and empty again */
    snprintf(file, sizeof file, "%s/probe/file", tu_tmpdir());
    tu_write_file(file, "x", 1);
    snprintf(dir, sizeof dir, "%s/ck", file);
    assert_int_equal(pt_check_writable_dir(dir, "checkpoint.dir"), PT_ERR_IO);
    expect_msg("checkpoint.dir: ");
    expect_msg("Not a directory");
}

/* name under the test's directory links/ (made), the victim a regular file holding "precious" */
static void link_case(char *path, size_t cap, const char *name, char *victim, size_t vcap) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/links", tu_tmpdir());
    assert_int_equal(pt_mkdirs(dir), PT_OK);
    snprintf(victim, vcap, "%s/victim", dir);
    tu_write_file(victim, "precious", 8);
    snprintf(path, cap, "%s/%s", dir, name);
    unlink(path);
}

static void expect_victim_whole(const char *victim) {
    char *text;
    size_t len;
    assert_int_equal(pt_read_file(victim, &text, &len), PT_OK);
    if (len != 8 || memcmp(text, "precious", 8) != 0)
        fail_msg("%s was written through a link: %zu bytes", victim, len);
    free(text);
}

/* No output is written through a symbolic link: a linked temporary (config.json.tmp; before,
 * opened O_TRUNC: the victim overwritten, then the link renamed into place) or a linked final
 * file is refused naming it; a stale regular temporary (a crash's) is replaced. */
static void test_atomic_write_never_follows_links(void **state) {
    (void)state;
    char path[800], tmp[820], victim[800];
    link_case(path, sizeof path, "a.json", victim, sizeof victim);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    unlink(tmp);
    assert_int_equal(symlink(victim, tmp), 0);
    assert_int_equal(pt_write_file_atomic(path, "new", 3), PT_ERR_IO);
    expect_msg("a.json.tmp: a symbolic link");
    expect_victim_whole(victim);
    unlink(tmp);
    tu_write_file(tmp, "stale", 5);
    assert_int_equal(pt_write_file_atomic(path, "new", 3), PT_OK);
    struct stat sb;
    assert_int_equal(lstat(tmp, &sb) == 0, 0);
    unlink(path);
    assert_int_equal(symlink(victim, path), 0);
    assert_int_equal(pt_write_file_atomic(path, "new", 3), PT_ERR_IO);
    expect_msg("a.json: a symbolic link");
    expect_victim_whole(victim);
    assert_int_equal(lstat(path, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
}

/* The safetensors writer's temporary (fopen "wb" before), the trace (fopen "w") and the probe of
 * a writable directory (O_TRUNC on a predictable name) never write through a link. */
static void test_outputs_never_follow_links(void **state) {
    (void)state;
    char path[1000], tmp[1020], victim[800];
    link_case(path, sizeof path, "w.safetensors", victim, sizeof victim);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    unlink(tmp);
    assert_int_equal(symlink(victim, tmp), 0);
    pt_st_writer *w = pt_st_writer_create();
    float x[2] = {1, 2};
    int64_t shape[1] = {2};
    assert_int_equal(pt_st_writer_add_f32(w, "x", shape, 1, x, PT_ST_DTYPE_F32), PT_OK);
    assert_int_equal(pt_st_writer_write(w, path), PT_ERR_IO);
    expect_msg("w.safetensors.tmp: a symbolic link");
    expect_victim_whole(victim);
    unlink(tmp);
    assert_int_equal(pt_st_writer_write(w, path), PT_OK); /* and without the link it writes */
    pt_st_writer_free(w);

    link_case(path, sizeof path, "trace-rank0.json", victim, sizeof victim);
    assert_int_equal(symlink(victim, path), 0);
    assert_int_equal(pt_trace_write(path, "rank 0"), PT_ERR_IO);
    expect_msg("trace-rank0.json: a symbolic link");
    expect_victim_whole(victim);

    char host[64] = "", name[200];
    gethostname(host, sizeof host - 1);
    snprintf(name, sizeof name, ".pentatron-probe-%s-%ld", host, (long)getpid());
    link_case(path, sizeof path, name, victim, sizeof victim);
    assert_int_equal(symlink(victim, path), 0);
    snprintf(tmp, sizeof tmp, "%s/links", tu_tmpdir());
    assert_int_equal(pt_check_writable_dir(tmp, "checkpoint.dir"), PT_ERR_IO);
    expect_msg("a symbolic link");
    expect_victim_whole(victim);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_long_values_refused_not_truncated),
        cmocka_unit_test(test_config_float_beyond_float_refused),
        cmocka_unit_test(test_config_threads_bounded),
        cmocka_unit_test(test_config_file_must_be_regular),
        cmocka_unit_test(test_fifo_shard_refused),
        cmocka_unit_test(test_truncated_shard_named_not_sigbus),
        cmocka_unit_test(test_checkpoint_index_negative_step_refused),
        cmocka_unit_test(test_checkpoint_index_block_overflow_refused),
        cmocka_unit_test(test_memory_precheck_overflow_and_limit),
        cmocka_unit_test(test_metrics_write_error_reported),
        cmocka_unit_test(test_writable_dir_probe),
        cmocka_unit_test(test_atomic_write_never_follows_links),
        cmocka_unit_test(test_outputs_never_follow_links),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
