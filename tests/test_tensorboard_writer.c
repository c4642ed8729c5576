/* test_tensorboard_writer.c: the event file writer's parts (src/train/tensorboard.c) that the
 * event files read in tests/test_tensorboard.sh cannot show:
 *   - pt_crc32c against the CRC-32C test vectors of RFC 3720, appendix B.4 (32 bytes of zeros,
 *     of ones, ascending, descending, and the SCSI Read (10) command PDU), the check value of
 *     the Castagnoli CRC ("123456789"), and in pieces (continuing a CRC gives the whole's);
 *   - a step that cannot be written (a full disk: the stream swapped for /dev/full's) is an error
 *     naming logging.tensorboard, the file and the step;
 *   - an event file already at the name is never written over: the open fails, naming it, and
 *     the file keeps its bytes;
 *   - a regular file as the directory, or a directory under one: refused, naming the key. */
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <string.h>

#include "pt/config.h"
#include "pt/tensorboard.h"
#include "testutil.h"

static void test_rfc3720_vectors(void **state) {
    (void)state;
    uint8_t b[32];
    memset(b, 0, 32);
    assert_int_equal(pt_crc32c(0, b, 32), 0x8A9136AAu);
    memset(b, 0xff, 32);
    assert_int_equal(pt_crc32c(0, b, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)i;
    assert_int_equal(pt_crc32c(0, b, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)(31 - i);
    assert_int_equal(pt_crc32c(0, b, 32), 0x113FDB5Cu);
    static const uint8_t pdu[48] = {
        0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
        0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    assert_int_equal(pt_crc32c(0, pdu, sizeof pdu), 0xD9963A56u);
}

static void test_check_value_and_pieces(void **state) {
    (void)state;
    const char *s = "123456789";
    assert_int_equal(pt_crc32c(0, s, 9), 0xE3069283u);
    assert_int_equal(pt_crc32c(pt_crc32c(0, s, 4), s + 4, 5), 0xE3069283u);
    assert_int_equal(pt_crc32c(0, s, 0), 0u);
}

static void expect_msg(const char *needle) {
    if (!strstr(pt_last_error(), needle))
        fail_msg("expected a message containing \"%s\", got \"%s\"", needle, pt_last_error());
}

static void test_write_error_reported(void **state) {
    (void)state;
    pt_config c;
    pt_config_defaults(&c);
    pt_tb tb;
    char dir[700];
    snprintf(dir, sizeof dir, "%s/tb_full", tu_tmpdir());
    assert_int_equal(pt_tb_open(&tb, dir, &c.model), PT_OK);
    fclose(tb.f);
    tb.f = fopen("/dev/full", "w");
    assert_non_null(tb.f);
    pt_step_stats s = {.step = 3, .loss = 1.0};
    pt_rank_memory mem = {0};
    assert_int_equal(pt_tb_write(&tb, &s, NULL, &c.model, &mem), PT_ERR_IO);
    expect_msg("logging.tensorboard: writing ");
    expect_msg(" failed at step 3: No space left on device");
    pt_tb_close(&tb);
}

static void test_existing_file_kept(void **state) {
    (void)state;
    pt_config c;
    pt_config_defaults(&c);
    pt_tb a, b;
    char dir[700];
    snprintf(dir, sizeof dir, "%s/tb_twice", tu_tmpdir());
    /* the same second, host and process: the same name (retried once across a second's turn) */
    assert_int_equal(pt_tb_open(&a, dir, &c.model), PT_OK);
    pt_status st = pt_tb_open(&b, dir, &c.model);
    if (st == PT_OK && strcmp(a.path, b.path)) {
        pt_tb_close(&b);
        unlink(b.path);
        pt_tb_close(&a);
        unlink(a.path);
        assert_int_equal(pt_tb_open(&a, dir, &c.model), PT_OK);
        st = pt_tb_open(&b, dir, &c.model);
    }
    assert_int_equal(st, PT_ERR_IO);
    expect_msg("logging.tensorboard: cannot create ");
    expect_msg("File exists");
    struct stat sa;
    assert_int_equal(stat(a.path, &sa), 0);
    /* a's file_version record, whole: wall_time 9, step 2, file_version 2 + 13 bytes */
    assert_int_equal(sa.st_size, 12 + 26 + 4);
    pt_tb_close(&a);
}

static void test_file_as_dir_refused(void **state) {
    (void)state;
    pt_config c;
    pt_config_defaults(&c);
    pt_tb tb;
    char path[700], sub[800];
    snprintf(path, sizeof path, "%s/a_file", tu_tmpdir());
    tu_write_file(path, "x", 1);
    assert_int_equal(pt_tb_open(&tb, path, &c.model), PT_ERR_IO);
    expect_msg("logging.tensorboard");
    snprintf(sub, sizeof sub, "%s/sub", path);
    assert_int_equal(pt_tb_open(&tb, sub, &c.model), PT_ERR_IO);
    expect_msg("logging.tensorboard");
    pt_tb_close(&tb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rfc3720_vectors),
        cmocka_unit_test(test_check_value_and_pieces),
        cmocka_unit_test(test_write_error_reported),
        cmocka_unit_test(test_existing_file_kept),
        cmocka_unit_test(test_file_as_dir_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
