/* test_crc32c.c: pt_crc32c (the TensorBoard event files' checksum, src/train/tensorboard.c)
 * against the CRC-32C test vectors of RFC 3720, appendix B.4 (32 bytes of zeros, of ones,
 * ascending, descending, and the SCSI Read (10) command PDU), the check value of the
 * Castagnoli CRC ("123456789"), and in pieces: continuing a CRC gives the whole buffer's. */
#include <stdint.h>
#include <string.h>

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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rfc3720_vectors),
        cmocka_unit_test(test_check_value_and_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
