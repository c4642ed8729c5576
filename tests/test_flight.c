/* test_flight.c: the flight recorder (src/comm/flight.c): its records and counters as the comm layer
 * makes them, and the verdict on hangs made by hand, one per kind of cause: a rank that does not
 * answer (named with the collectives it holds up and the last its peers completed with it), a
 * rank that answers but never entered the collective (followed down a chain of waits), a rank
 * stopped inside a wait its peers completed, a collective every member entered, a deadlock of
 * receives, and nothing hung; then `trace why` on flight files written by hand. (tests/test_hang.sh
 * stops and kills ranks of real jobs.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pt/flight.h"
#include "testutil.h"

enum { CAP = 64 };

static pt_flight_state *mk(int rank, int world) {
    pt_flight_state *s = calloc(1, sizeof *s + CAP * sizeof(int32_t));
    memcpy(s->magic, PT_FLIGHT_MAGIC, 8);
    s->version = PT_FLIGHT_VERSION;
    s->bytes = (uint32_t)(sizeof *s + CAP * sizeof(int32_t));
    s->rank = rank, s->world = world, s->members_cap = CAP, s->wait_group = -1;
    snprintf(s->label, sizeof s->label, "dp%d pp0 cp0 tp%d", rank / 2, rank % 2);
    snprintf(s->host, sizeof s->host, "h%d", rank / 2);
    return s;
}

/* A group of s: key (the same on every member), members, collectives entered and completed (the
 * last completed at time t); returns its index. */
static int grp(pt_flight_state *s, const char *name, uint64_t key, const int *members, int size,
               uint64_t entered, uint64_t done, double t) {
    int g = s->ngroups++;
    pt_flight_group *G = &s->groups[g];
    snprintf(G->name, sizeof G->name, "%s", name);
    G->key = key, G->size = size, G->live = 1, G->members = s->members_used;
    for (int i = 0; i < size; i++) {
        if (members[i] == s->rank) G->rank = i;
        s->member[s->members_used++] = members[i];
    }
    G->coll_entered = entered, G->coll_done = done;
    if (done) G->last_seq = done, G->last_op = PT_COMM_ALLGATHER, G->last_t = t;
    return g;
}

static void wait_in(pt_flight_state *s, int g, pt_comm_op op, uint64_t seq, int peer) {
    s->waiting = 1, s->wait_group = g, s->wait_op = op, s->wait_seq = seq, s->wait_peer = peer;
}

static void verdict(pt_flight_state **st, int n, char *out, int want_causes) {
    int causes = pt_flight_verdict((const pt_flight_state *const *)st, NULL, n, NULL, out, 4096);
    printf("%s", out);
    if (causes != want_causes) fail_msg("%d causes, expected %d: %s", causes, want_causes, out);
}

static void has(const char *text, const char *needle) {
    if (!strstr(text, needle)) fail_msg("expected \"%s\" in: %s", needle, text);
}

/* dp 2 x tp 2 (rank = 2 dp + tp): dp groups {0,2} {1,3}, tp groups {0,1} {2,3} */
static const int dpA[] = {0, 2}, dpB[] = {1, 3}, tpA[] = {0, 1}, tpB[] = {2, 3};

/* rank 3 stopped: rank 1 waits for it in dp #57, rank 2 in tp #900; rank 0 waits in dp #57 for
 * rank 2 (a chain): only rank 3 is the cause; its last is the newest collective its peers
 * completed with it (tp #899 at t = 20, newer than dp #56 at t = 10) */
static void test_silent_rank(void **state) {
    (void)state;
    pt_flight_state *st[4] = {mk(0, 4), mk(1, 4), mk(2, 4), NULL};
    char out[4096];
    wait_in(st[0], grp(st[0], "dp", 100, dpA, 2, 57, 56, 10), PT_COMM_REDUCE_SCATTER, 57, -1);
    grp(st[0], "tp", 200, tpA, 2, 900, 900, 11);
    wait_in(st[1], grp(st[1], "dp", 101, dpB, 2, 57, 56, 10), PT_COMM_REDUCE_SCATTER, 57, -1);
    grp(st[1], "tp", 200, tpA, 2, 900, 900, 11);
    grp(st[2], "dp", 100, dpA, 2, 56, 56, 10);
    wait_in(st[2], grp(st[2], "tp", 201, tpB, 2, 900, 899, 20), PT_COMM_ALLREDUCE, 900, -1);
    verdict(st, 4, out, 1);
    has(out, "rank 3 does not answer (stopped, hung or dead) and holds up reduce-scatter #57 of "
             "group \"dp\" (rank 1 waits in it) and all-reduce #900 of group \"tp\" (rank 2 waits "
             "in it); its last: all-gather #899 of \"tp\"");
    if (strstr(out, "rank 2 ") == out || strstr(out, "rank 0 (")) fail_msg("a waiting rank named: %s", out);
    /* with the roster, the silent rank's coordinates and host */
    char roster[4][PT_FLIGHT_LABEL + PT_FLIGHT_HOST] = {{0}};
    snprintf(roster[3], PT_FLIGHT_LABEL, "dp1 pp0 cp0 tp1");
    snprintf(roster[3] + PT_FLIGHT_LABEL, PT_FLIGHT_HOST, "h1");
    pt_flight_verdict((const pt_flight_state *const *)st, NULL, 4, roster[0], out, sizeof out);
    has(out, "rank 3 (dp1 pp0 cp0 tp1) on host h1 does not answer");
    for (int i = 0; i < 3; i++) free(st[i]);
}

/* every rank answers; rank 3 never entered dp #57 and is in no communication: named so, with
 * its own last record */
static void test_rank_behind(void **state) {
    (void)state;
    pt_flight_state *st[4] = {mk(0, 4), mk(1, 4), mk(2, 4), mk(3, 4)};
    char out[4096];
    grp(st[0], "dp", 100, dpA, 2, 57, 57, 10);
    grp(st[2], "dp", 100, dpA, 2, 57, 57, 10);
    wait_in(st[1], grp(st[1], "dp", 101, dpB, 2, 57, 56, 10), PT_COMM_ALLREDUCE, 57, -1);
    int g = grp(st[3], "dp", 101, dpB, 2, 56, 56, 10);
    st[3]->nrec = 1;
    st[3]->ring[0] = (pt_flight_rec){.id = 1, .seq = 56, .t_enter = 9, .t_done = 10, .group = g,
                                     .op = PT_COMM_ALLREDUCE, .peer = -1};
    verdict(st, 4, out, 1);
    has(out, "rank 3 (dp1 pp0 cp0 tp1) on host h1 never entered all-reduce #57 of group \"dp\" "
             "(rank 1 waits in it) and was in no communication");
    has(out, "its last: all-reduce #56 of group \"dp\" (completed)");
    for (int i = 0; i < 4; i++) free(st[i]);
}

/* rank 1 waits in dp #57, which rank 3 (waiting elsewhere) completed: rank 1 stopped polling */
static void test_frozen_and_stuck(void **state) {
    (void)state;
    pt_flight_state *st[4] = {mk(0, 4), mk(1, 4), mk(2, 4), mk(3, 4)};
    char out[4096];
    wait_in(st[1], grp(st[1], "dp", 101, dpB, 2, 57, 56, 10), PT_COMM_ALLREDUCE, 57, -1);
    grp(st[3], "dp", 101, dpB, 2, 57, 57, 12);
    verdict(st, 4, out, 1);
    has(out, "rank 1 (dp0 pp0 cp0 tp1) on host h0 stopped inside its wait in all-reduce #57 of group "
             "\"dp\" (rank 1 waits in it), which its peers completed");
    /* both entered, neither completed: the collective itself is stuck */
    st[3]->groups[0].coll_done = 56;
    wait_in(st[3], 0, PT_COMM_ALLREDUCE, 57, -1);
    verdict(st, 4, out, 1); /* one line for the collective, its waiting members listed */
    has(out, "every member entered all-reduce #57 of group \"dp\" (ranks 1, 3 wait in it)");
    for (int i = 0; i < 4; i++) free(st[i]);
}

/* ranks 0 and 1 each wait to receive from the other: a deadlock; nothing waiting: no cause */
static void test_deadlock_and_nothing(void **state) {
    (void)state;
    pt_flight_state *st[2] = {mk(0, 2), mk(1, 2)};
    char out[4096];
    static const int pp[] = {0, 1};
    wait_in(st[0], grp(st[0], "pp", 300, pp, 2, 0, 0, 0), PT_COMM_RECV, 4, 1);
    wait_in(st[1], grp(st[1], "pp", 300, pp, 2, 0, 0, 0), PT_COMM_RECV, 4, 0);
    verdict(st, 2, out, 1);
    has(out, "deadlock: rank 0 (dp0 pp0 cp0 tp0) on host h0 waits in recv #4 from rank 1 in group "
             "\"pp\"; rank 1 (dp0 pp0 cp0 tp1) on host h0 waits in recv #4 from rank 0 in group "
             "\"pp\": each waits for the next");
    st[0]->waiting = st[1]->waiting = 0;
    verdict(st, 2, out, 0);
    assert_string_equal(out, "");
    free(st[0]), free(st[1]);
}

/* The recorder itself, then its file read back by `trace why`; then files of two ranks made by
 * hand: rank 0 timed out in dp #3, rank 1 neither timed out nor answered (silent: stopped). */
static void test_recorder_and_why(void **state) {
    (void)state;
    pt_flight_start(0, 1);
    const pt_flight_state *s = pt_flight_self();
    assert_non_null(s);
    int members[] = {0};
    int a = pt_flight_group_add("dp", 0, 1, members), b = pt_flight_group_add("tp", 0, 1, members);
    assert_true(a >= 0 && b == a + 1);
    assert_true(s->groups[a].key != s->groups[b].key); /* names differ */
    uint64_t seq1, seq2, seq3;
    uint64_t id1 = pt_flight_enter(a, PT_COMM_ALLREDUCE, -1, 64, &seq1);
    uint64_t id2 = pt_flight_enter(a, PT_COMM_SEND, 0, 8, &seq2);
    uint64_t id3 = pt_flight_enter(a, PT_COMM_ALLGATHER, -1, 32, &seq3);
    assert_true(seq1 == 1 && seq2 == 1 && seq3 == 2); /* collectives and sends numbered apart */
    pt_flight_done(id3, a, PT_COMM_ALLGATHER, seq3);
    assert_true(s->groups[a].coll_entered == 2 && s->groups[a].coll_done == 2);
    assert_int_equal(s->groups[a].last_op, PT_COMM_ALLGATHER);
    assert_true(s->ring[0].t_done == 0 && s->ring[2].t_done > 0 && s->ring[1].peer == 0);
    (void)id1, (void)id2;
    pt_flight_wait_begin(a, PT_COMM_ALLREDUCE, seq1, -1);
    assert_true(s->waiting && s->wait_seq == 1);
    pt_flight_wait_end();
    assert_false(s->waiting);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/own", tu_tmpdir());
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(pt_flight_file(dir), PT_OK);
    s = pt_flight_self();
    assert_true(s->groups[a].coll_entered == 2); /* moved into the file */
    pt_flight_finish();
    char *text;
    size_t len;
    FILE *f = open_memstream(&text, &len);
    assert_int_equal(pt_flight_why(dir, f), PT_OK);
    fclose(f);
    printf("%s", text);
    has(text, "rank 0 on host");
    has(text, "finished; its last: all-gather #2 of group \"dp\" (completed)");
    has(text, "every rank finished: nothing hung");
    free(text);

    /* two ranks' files by hand */
    snprintf(dir, sizeof dir, "%s/two", tu_tmpdir());
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    assert_int_equal(system(cmd), 0);
    pt_flight_state *st[2] = {mk(0, 2), mk(1, 2)};
    static const int pair[] = {0, 1};
    wait_in(st[0], grp(st[0], "dp", 7, pair, 2, 3, 2, 5), PT_COMM_REDUCE_SCATTER, 3, -1);
    st[0]->timed_out = st[0]->answered = 1;
    int g = grp(st[1], "dp", 7, pair, 2, 2, 2, 5);
    st[1]->nrec = 1;
    st[1]->ring[0] = (pt_flight_rec){.id = 1, .seq = 2, .t_enter = 4, .t_done = 5, .group = g,
                                     .op = PT_COMM_ALLGATHER, .peer = -1};
    for (int r = 0; r < 2; r++) {
        char path[1400];
        snprintf(path, sizeof path, "%s/flight-rank%d.bin", dir, r);
        tu_write_file(path, (const char *)st[r], st[r]->bytes);
    }
    f = open_memstream(&text, &len);
    assert_int_equal(pt_flight_why(dir, f), PT_OK);
    fclose(f);
    printf("%s", text);
    has(text, "rank 0 (dp0 pp0 cp0 tp0) on host h0: waits in reduce-scatter #3 of group \"dp\"");
    has(text, "rank 1 (dp0 pp0 cp0 tp1) on host h0 does not answer (stopped, hung or dead) and "
              "holds up reduce-scatter #3 of group \"dp\" (rank 0 waits in it); its last: "
              "all-gather #2 of group \"dp\" (completed)");
    free(text);
    /* a file that is not a flight record */
    char path[1400];
    snprintf(path, sizeof path, "%s/flight-rank1.bin", dir);
    tu_write_file(path, "garbage", 7);
    f = open_memstream(&text, &len);
    assert_int_equal(pt_flight_why(dir, f), PT_OK); /* rank 1's file is missing now */
    fclose(f);
    has(text, "rank 1: no file");
    free(text);
    snprintf(path, sizeof path, "%s/empty", tu_tmpdir());
    snprintf(cmd, sizeof cmd, "mkdir -p %s/empty", tu_tmpdir());
    assert_int_equal(system(cmd), 0);
    f = open_memstream(&text, &len);
    assert_int_equal(pt_flight_why(path, f), PT_ERR_IO);
    fclose(f);
    free(text);
    has(pt_last_error(), "no flight record");
    free(st[0]), free(st[1]);
}

/* Flight files mutated at random (seeded: bytes changed, files cut short): `trace why` reads
 * each to a verdict or an error, never out of bounds or into a loop (tests/test_flight_asan.sh
 * runs this under the sanitizers). */
static void test_why_fuzz(void **state) {
    (void)state;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/fuzz", tu_tmpdir());
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/fuzz", tu_tmpdir());
    assert_int_equal(system(cmd), 0);
    pt_flight_state *st[2] = {mk(0, 2), mk(1, 2)};
    static const int pair[] = {0, 1};
    wait_in(st[0], grp(st[0], "dp", 7, pair, 2, 3, 2, 5), PT_COMM_REDUCE_SCATTER, 3, -1);
    st[0]->answered = 1;
    grp(st[1], "dp", 7, pair, 2, 2, 2, 5);
    st[1]->nrec = 300;
    uint64_t rng = 12345;
    size_t bytes = st[0]->bytes;
    unsigned char *buf = malloc(bytes);
    int iters = getenv("PT_FUZZ_ITERS") ? atoi(getenv("PT_FUZZ_ITERS")) : 300, errors = 0;
    for (int it = 0; it < iters; it++) {
        for (int r = 0; r < 2; r++) {
            memcpy(buf, st[r], bytes);
            size_t len = bytes;
            int flips = 1 + (int)((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 60);
            for (int k = 0; k < flips; k++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                /* mostly the header and group table, where the counts and indices are */
                size_t at = (size_t)(rng >> 33) % (k & 1 ? bytes : sizeof(pt_flight_state) - sizeof st[0]->ring);
                buf[at] = (unsigned char)(rng >> 20);
            }
            if (it % 17 == 0) len = (size_t)(rng >> 35) % bytes;
            char path[1400];
            snprintf(path, sizeof path, "%s/flight-rank%d.bin", dir, r);
            tu_write_file(path, (const char *)buf, len);
        }
        char *text;
        size_t tl;
        FILE *f = open_memstream(&text, &tl);
        if (pt_flight_why(dir, f) != PT_OK) errors++;
        fclose(f);
        free(text);
    }
    printf("%d mutated pairs of flight files: %d refused, the others explained\n", iters, errors);
    free(buf), free(st[0]), free(st[1]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_silent_rank),
        cmocka_unit_test(test_rank_behind),
        cmocka_unit_test(test_frozen_and_stuck),
        cmocka_unit_test(test_deadlock_and_nothing),
        cmocka_unit_test(test_recorder_and_why),
        cmocka_unit_test(test_why_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
