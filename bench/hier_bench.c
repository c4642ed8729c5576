/* hier_bench.c: the time of one all-reduce (sum, fp32, in place) over every process of the job,
 * and the bytes it puts on this host's link, for bench/hier_bench.sh and tests/test_hier.sh.
 *
 *   bench_hier pt|mpi REPS SIZE...
 * pt: pentatron's all-reduce (c->iallreduce and pt_comm_wait) over the world, hierarchical or
 * flat as PT_COMM_HIER chooses (include/pt/comm.h); mpi: MPI's own blocking MPI_Allreduce, its
 * collective component chosen by the MCA parameters (coll_han_priority, ...), out of place (Open
 * MPI 4.1.4's han crashes in place). SIZE in bytes, with
 * a suffix k or m for KiB and MiB. Every rank starts each call with every element equal to its
 * rank + 1, so the sum is exact (N(N+1)/2, an integer) and checked on every element after every
 * call. Per size, rank 0 prints a line:
 *   size B reps R median_s T min_s T link_bytes X link_payload Y hier H ok 1
 * T: the slowest rank's time of a call (after a barrier), median and least over the REPS calls
 * after one untimed; X: the bytes the hosts sent on their links (eth0's counters, read by each
 * host's first process around the timed calls, summed over hosts) per call, Y the same less 66
 * bytes of Ethernet/IP/TCP headers a packet (-1 without /sys/class/net/eth0: not a cluster of
 * scripts/cluster.sh); H: 1 if the all-reduce ran hierarchically. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_mpi.h"
#include "pt/comm.h"

/* eth0's bytes and packets sent, or -1 */
static void link_sent(int64_t out[2]) {
    out[0] = out[1] = -1;
    const char *f[2] = {"/sys/class/net/eth0/statistics/tx_bytes",
                        "/sys/class/net/eth0/statistics/tx_packets"};
    for (int i = 0; i < 2; i++) {
        FILE *fp = fopen(f[i], "r");
        long long v;
        if (fp && fscanf(fp, "%lld", &v) == 1) out[i] = v;
        if (fp) fclose(fp);
    }
}

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (*end == 'k' || *end == 'K') v *= 1024;
    if (*end == 'm' || *end == 'M') v *= 1048576;
    return (size_t)v;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 4 || (strcmp(argv[1], "pt") && strcmp(argv[1], "mpi")) || atoi(argv[2]) < 1) {
        fprintf(stderr, "usage: bench_hier pt|mpi REPS SIZE... (SIZE in bytes, k or m suffix)\n");
        return 2;
    }
    int use_mpi = !strcmp(argv[1], "mpi"), reps = atoi(argv[2]);
    int rank, world_size;
    if (pt_comm_runtime_init(&rank, &world_size) != PT_OK) {
        fprintf(stderr, "bench_hier: %s\n", pt_last_error());
        return 1;
    }
    pt_comm *w = pt_comm_world(120.0);
    if (!use_mpi && pt_comm_hier_setup(w) != PT_OK) {
        if (rank == 0) fprintf(stderr, "bench_hier: %s\n", pt_last_error());
        pt_comm_runtime_abort(1);
    }
    int host, local;
    pt_comm_host(&host, &local);
    double *times = pt_calloc((size_t)reps, sizeof *times);
    double *all = pt_calloc((size_t)w->size, sizeof *all);
    int bad_total = 0;
    for (int a = 3; a < argc; a++) {
        size_t count = parse_size(argv[a]) / sizeof(float);
        float *buf = pt_malloc((count ? count : 1) * sizeof *buf);
        /* MPI's own out of place (Open MPI 4.1.4's han crashes in place) */
        float *send = use_mpi ? pt_malloc((count ? count : 1) * sizeof *send) : NULL;
        const float want = (float)w->size * (float)(w->size + 1) / 2.0f;
        int64_t sent[2] = {0, 0}, before[2], after[2];
        int bad = 0;
        pt_comm_stats host_st, hosts; /* the cross-host stage's calls so far: did it run? */
        pt_comm_hier_stats(w, &host_st, &hosts);
        uint64_t crossed = hosts.calls[PT_COMM_ALLREDUCE];
        for (int r = -1; r < reps; r++) { /* r = -1: untimed */
            for (size_t i = 0; i < count; i++) (send ? send : buf)[i] = (float)(w->rank + 1);
            pt_barrier(w);
            if (r == 0 && local == 0) link_sent(before);
            double t0 = pt_now();
            if (use_mpi)
                pt_comm_mpi_allreduce_blocking(w, send, buf, count, PT_DTYPE_F32);
            else
                pt_comm_wait(w, w->iallreduce(w, buf, count, PT_DTYPE_F32));
            all[w->rank] = pt_now() - t0;
            for (size_t i = 0; i < count; i++) bad += buf[i] != want;
            pt_barrier(w);
            if (r == reps - 1 && local == 0) {
                link_sent(after);
                for (int k = 0; k < 2; k++)
                    sent[k] = before[k] < 0 || after[k] < 0 ? -1 : after[k] - before[k];
            }
            pt_allgather(w, NULL, all, 1, PT_DTYPE_F64);
            double worst = 0;
            for (int i = 0; i < w->size; i++) worst = all[i] > worst ? all[i] : worst;
            if (r >= 0) times[r] = worst;
        }
        /* per host, its first process's counters; -1 anywhere: none */
        int64_t sums[3] = {local == 0 ? sent[0] : 0, local == 0 ? sent[1] : 0,
                           local == 0 && sent[0] < 0};
        pt_allreduce_sum(w, sums, 3, PT_DTYPE_I64);
        int32_t bads = bad;
        pt_allreduce_sum(w, &bads, 1, PT_DTYPE_I32);
        bad_total += bads;
        pt_comm_hier_stats(w, &host_st, &hosts);
        qsort(times, (size_t)reps, sizeof *times, cmp_double);
        double med = reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2]);
        if (rank == 0) {
            double x = sums[2] ? -1 : (double)sums[0] / reps;
            double y = sums[2] ? -1 : (double)(sums[0] - 66 * sums[1]) / reps;
            int hier = (int)(hosts.calls[PT_COMM_ALLREDUCE] > crossed);
            printf("size %zu reps %d median_s %.6f min_s %.6f link_bytes %.0f link_payload %.0f "
                   "hier %d ok %d\n", count * sizeof(float), reps, med, times[0], x, y, hier,
                   bads == 0);
            fflush(stdout);
        }
        free(buf);
        free(send);
    }
    free(times);
    free(all);
    w->free(w);
    pt_comm_runtime_finalize();
    return bad_total != 0;
}
