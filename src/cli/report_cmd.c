/* report_cmd.c: `pentatron report RUN`: one self-contained HTML page of a run: the loss and
 * validation curves, throughput and MFU from the metrics lines (logging.metrics), and from the
 * report.json the trainer writes beside them (src/train/report.c) the memory per rank by kind, the
 * communication per group and the pipeline schedule, drawn by the code of `pentatron schedule`.
 * Charts are inline SVG made here; the page loads nothing (no script, no font, no network). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/commands.h"
#include "pt/metrics.h"
#include "pt/schedule.h"

static void pt_report_usage(FILE *f) {
    fprintf(f,
            "usage: pentatron report RUN [--out FILE]\n"
            "\n"
            "Writes one self-contained HTML page about a training run: the loss and validation\n"
            "curves, throughput and MFU per step, the memory of every rank by kind, the\n"
            "communication of every parallel group (bytes and time blocked per step) and the\n"
            "pipeline schedule. It opens in any browser and loads nothing else.\n"
            "\n"
            "  RUN          the directory of logging.metrics (holding metrics.jsonl), or the metrics\n"
            "               file itself; the trainer writes report.json beside it at every run\n"
            "               report (logging.report_every) and at the end, for the memory,\n"
            "               communication and schedule sections\n"
            "  --out FILE   where to write the page (default: report.html beside the metrics)\n"
            "  --help       print this help\n"
            "\n"
            "A run still going, one without held-out evaluation (data.val) or without a pipeline\n"
            "(pp = 1) gives a page that says so where those figures would be.\n");
}

/* The metrics lines as series, one entry per step (a step logged again after a resume replaces
 * what followed it). */
typedef struct {
    int n, cap;
    double *step, *loss, *val, *tps, *mfu, *mfu_ds;
    int n_val, has_ds;
} pt_run_series;

static void pt_series_push(pt_run_series *s, double step, double loss, double val, double tps,
                           double mfu, double mfu_ds) {
    while (s->n > 0 && s->step[s->n - 1] >= step) s->n--; /* a resumed run went back */
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        double **cols[] = {&s->step, &s->loss, &s->val, &s->tps, &s->mfu, &s->mfu_ds};
        for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++)
            *cols[i] = pt_realloc(*cols[i], (size_t)s->cap * sizeof(double));
    }
    int i = s->n++;
    s->step[i] = step, s->loss[i] = loss, s->val[i] = val, s->tps[i] = tps, s->mfu[i] = mfu;
    s->mfu_ds[i] = mfu_ds;
}

static void pt_series_free(pt_run_series *s) {
    free(s->step), free(s->loss), free(s->val), free(s->tps), free(s->mfu), free(s->mfu_ds);
}

/* A number of a metrics line: NAN when absent or null. */
static double pt_json_field(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* Reads the metrics file; PT_ERR_FORMAT naming the file and the line that is not a metrics line
 * (a last line without its newline is a line being written, and left out). */
static pt_status pt_read_metrics(const char *path, pt_run_series *s) {
    char *text;
    size_t len;
    PT_TRY(pt_read_file(path, &text, &len));
    memset(s, 0, sizeof *s);
    pt_status st = PT_OK;
    int line = 0;
    for (char *p = text; st == PT_OK && p < text + len;) {
        char *nl = memchr(p, '\n', (size_t)(text + len - p));
        line++;
        if (!nl) break; /* being written */
        *nl = 0;
        json_error_t err;
        int blank = !p[strspn(p, " \t\r")];
        json_t *o = blank ? NULL : json_loads(p, 0, &err);
        json_t *step = json_object_get(o, "step"), *loss = json_object_get(o, "loss");
        int metric = json_is_integer(step) && (json_is_number(loss) || json_is_null(loss));
        if (!blank && !metric)
            st = pt_errorf(PT_ERR_FORMAT, "%s is not a run's metrics: line %d is not a metrics line (a JSON "
                           "object with \"step\" and \"loss\", as logging.metrics writes)", path, line);
        else if (o)
            pt_series_push(s, (double)json_integer_value(step), pt_json_field(o, "loss"),
                           pt_json_field(o, "val_loss"), pt_json_field(o, "tokens_per_s"),
                           100 * pt_json_field(o, "mfu"), 100 * pt_json_field(o, "mfu_datasheet"));
        json_decref(o);
        p = nl + 1;
    }
    free(text);
    for (int i = 0; i < s->n; i++) {
        s->n_val += isfinite(s->val[i]);
        s->has_ds |= isfinite(s->mfu_ds[i]);
    }
    if (st != PT_OK) pt_series_free(s);
    return st;
}

/* Text for HTML: & < > " escaped. */
static void pt_html_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '&') fputs("&amp;", f);
        else if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

/* A round tick spacing: about `n` ticks over span (1, 2 or 5 × a power of ten). */
static double pt_tick_step(double span, int n) {
    double raw = span / n, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3 ? 2 : m < 7 ? 5 : 10) * p;
}

typedef struct {
    const char *name, *colour;
    const double *y; /* per step; NAN: no point there */
    int dots;        /* a marker at each point (sparse series: the evaluations) */
} pt_chart_series;

enum { PT_CW = 760, PT_CH = 300, PT_CL = 80, PT_CR = 20, PT_CT = 48, PT_CB = 50 };

/* A line chart of series over the steps: title, axes with their ticks and labels (ylabel with
 * its unit), a legend; each series one <polyline class="series" data-series=NAME> with a point
 * per step where it has a value. */
static void pt_chart(FILE *f, const char *id, const char *title, const char *ylabel,
                     const double *x, int n, const pt_chart_series *s, int ns) {
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < n; i++)
            if (isfinite(s[k].y[i])) {
                x0 = fmin(x0, x[i]), x1 = fmax(x1, x[i]);
                y0 = fmin(y0, s[k].y[i]), y1 = fmax(y1, s[k].y[i]);
            }
    fprintf(f, "<svg class=\"chart\" id=\"%s\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
               "height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", id, PT_CW, PT_CH);
    fprintf(f, "<text x=\"%d\" y=\"18\" font-size=\"15\" font-weight=\"bold\">%s</text>\n", PT_CL, title);
    int pw = PT_CW - PT_CL - PT_CR, ph = PT_CH - PT_CT - PT_CB;
    if (!(x0 <= x1)) {
        fprintf(f, "<text class=\"empty\" x=\"%d\" y=\"%d\">no steps recorded yet</text>\n</svg>\n",
                PT_CL, PT_CT + ph / 2);
        return;
    }
    if (x1 == x0) x0 -= 1, x1 += 1;
    if (y1 == y0) y0 -= fabs(y0) > 0 ? fabs(y0) * 0.1 : 1, y1 += fabs(y1) > 0 ? fabs(y1) * 0.1 : 1;
    double ys = pt_tick_step(y1 - y0, 5), xs = fmax(1, round(pt_tick_step(x1 - x0, 8)));
    y0 = floor(y0 / ys) * ys, y1 = ceil(y1 / ys) * ys;
#define PX(v) (PT_CL + ((v) - x0) / (x1 - x0) * pw)
#define PY(v) (PT_CT + ph - ((v) - y0) / (y1 - y0) * ph)
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n",
            PT_CL, PT_CT, pw, ph);
    for (double v = y0; v <= y1 + ys / 2; v += ys)
        fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                   "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.6g</text>\n",
                PT_CL, PT_CL + pw, PY(v), PY(v), PT_CL - 6, PY(v) + 4, fabs(v) < ys / 1e6 ? 0 : v);
    for (double v = ceil(x0 / xs) * xs; v <= x1; v += xs)
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#888\"/>"
                   "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.0f</text>\n",
                PX(v), PX(v), PT_CT + ph, PT_CT + ph + 5, PX(v), PT_CT + ph + 18, v);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", PT_CL + pw / 2, PT_CH - 10);
    fprintf(f, "<text transform=\"translate(16 %d) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
            PT_CT + ph / 2, ylabel);
    for (int k = 0; k < ns; k++) {
        int points = 0;
        for (int i = 0; i < n; i++) points += isfinite(s[k].y[i]);
        double lx = PT_CL + pw - 150.0 * (ns - k);
        fprintf(f, "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"36\" y2=\"36\" stroke=\"%s\" stroke-width=\"3\"/>"
                   "<text x=\"%.0f\" y=\"40\">%s</text>\n", lx, lx + 20, s[k].colour, lx + 25, s[k].name);
        fprintf(f, "<polyline class=\"series\" data-series=\"%s\" data-points=\"%d\" fill=\"none\" "
                   "stroke=\"%s\" stroke-width=\"1.5\" points=\"", s[k].name, points, s[k].colour);
        for (int i = 0, first = 1; i < n; i++)
            if (isfinite(s[k].y[i])) {
                fprintf(f, "%s%.1f,%.1f", first ? "" : " ", PX(x[i]), PY(s[k].y[i]));
                first = 0;
            }
        fprintf(f, "\"/>\n");
        for (int i = 0; i < n && s[k].dots; i++)
            if (isfinite(s[k].y[i]))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>step %.0f: %.4f"
                           "</title></circle>\n", PX(x[i]), PY(s[k].y[i]), s[k].colour, x[i], s[k].y[i]);
    }
#undef PX
#undef PY
    fprintf(f, "</svg>\n");
}

static const char *pt_fmt_mib(double bytes, char *out, size_t cap) {
    snprintf(out, cap, "%.2f", bytes / 1048576.0);
    return out;
}

/* Memory per rank by kind: a stacked bar per rank (SVG) and a table row per rank. */
static void pt_html_memory(FILE *f, json_t *ranks) {
    static const char *kind[] = {"params", "grads", "optim", "activations", "transient"};
    static const char *label[] = {"parameters", "gradients", "optimizer state", "activations",
                                  "transient (ZeRO)"};
    static const char *colour[] = {"#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3"};
    size_t R = json_array_size(ranks);
    double most = 0;
    for (size_t r = 0; r < R; r++) {
        double total = 0;
        for (int k = 0; k < 5; k++) total += pt_json_field(json_array_get(ranks, r), kind[k]);
        most = fmax(most, total);
    }
    double top = most > 0 ? ceil(most / 1048576.0 / pt_tick_step(most / 1048576.0, 5)) *
                            pt_tick_step(most / 1048576.0, 5) : 1;
    int bar = 22, h = PT_CT + (int)R * bar + 60, pw = PT_CW - 200 - PT_CR;
    fprintf(f, "<svg class=\"chart\" id=\"memory-chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
               "height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", PT_CW, h);
    fprintf(f, "<text x=\"200\" y=\"18\" font-size=\"15\" font-weight=\"bold\">Memory per rank by kind</text>\n");
    for (int k = 0; k < 5; k++)
        fprintf(f, "<rect x=\"%d\" y=\"28\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%d\" y=\"38\">%s"
                   "</text>\n", 10 + 140 * k, colour[k], 26 + 140 * k, label[k]);
    for (size_t r = 0; r < R; r++) {
        json_t *o = json_array_get(ranks, r);
        double x = 200, y = PT_CT + (double)r * bar;
        fprintf(f, "<text x=\"10\" y=\"%.0f\">rank %lld (dp%lld pp%lld cp%lld tp%lld)</text>\n", y + 15,
                (long long)pt_json_field(o, "rank"), (long long)pt_json_field(o, "dp"),
                (long long)pt_json_field(o, "pp"), (long long)pt_json_field(o, "cp"),
                (long long)pt_json_field(o, "tp"));
        for (int k = 0; k < 5; k++) {
            double w = pt_json_field(o, kind[k]) / 1048576.0 / top * pw;
            fprintf(f, "<rect x=\"%.1f\" y=\"%.0f\" width=\"%.1f\" height=\"%d\" fill=\"%s\"><title>%s %.2f MiB"
                       "</title></rect>\n", x, y, w, bar - 4, colour[k], label[k],
                    pt_json_field(o, kind[k]) / 1048576.0);
            x += w;
        }
    }
    double ys = pt_tick_step(top, 5), base = PT_CT + (double)R * bar;
    for (double v = 0; v <= top + ys / 2; v += ys)
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.0f\" y2=\"%.0f\" stroke=\"#888\"/><text x=\"%.1f\" "
                   "y=\"%.0f\" text-anchor=\"middle\">%g</text>\n", 200 + v / top * pw, 200 + v / top * pw,
                base, base + 5, 200 + v / top * pw, base + 18, v);
    fprintf(f, "<text x=\"%d\" y=\"%.0f\" text-anchor=\"middle\">MiB</text>\n</svg>\n", 200 + pw / 2, base + 40);
    fprintf(f, "<table id=\"memory\"><tr><th>rank</th><th class=\"words\">coordinates</th>"
               "<th>parameters</th><th>gradients</th>"
               "<th>optimizer</th><th>activations</th><th>transient</th><th>total</th><th>peak RSS</th></tr>\n");
    for (size_t r = 0; r < R; r++) {
        json_t *o = json_array_get(ranks, r);
        char b[32];
        double total = 0;
        fprintf(f, "<tr class=\"rank\"><td>%lld</td><td class=\"words\">dp%lld pp%lld cp%lld tp%lld</td>",
                (long long)pt_json_field(o, "rank"), (long long)pt_json_field(o, "dp"),
                (long long)pt_json_field(o, "pp"), (long long)pt_json_field(o, "cp"),
                (long long)pt_json_field(o, "tp"));
        for (int k = 0; k < 5; k++) {
            total += pt_json_field(o, kind[k]);
            fprintf(f, "<td>%s</td>", pt_fmt_mib(pt_json_field(o, kind[k]), b, sizeof b));
        }
        fprintf(f, "<td>%s</td>", pt_fmt_mib(total, b, sizeof b));
        fprintf(f, "<td>%s</td></tr>\n", pt_fmt_mib(pt_json_field(o, "peak_rss"), b, sizeof b));
    }
    fprintf(f, "</table>\n<p class=\"note\">MiB. Parameters, gradients, optimizer state and activations "
               "as allocated; transient: the peaks of the pooled ZeRO buffers; total: the five kinds; "
               "peak RSS: the process's peak resident memory.</p>\n");
}

/* Communication per group of more than one rank: a table row each. */
static void pt_html_groups(FILE *f, json_t *groups, double step_s) {
    if (json_array_size(groups) == 0) {
        fprintf(f, "<p class=\"missing\" id=\"groups-none\">No group of more than one rank: nothing was "
                   "communicated.</p>\n");
        return;
    }
    fprintf(f, "<table id=\"groups\"><tr><th>group</th><th>ranks</th><th class=\"words\">carries</th>"
               "<th>bytes/step</th>"
               "<th>max rank</th><th>blocked s/step</th><th>max rank</th><th>%% of step</th></tr>\n");
    for (size_t i = 0; i < json_array_size(groups); i++) {
        json_t *g = json_array_get(groups, i);
        char b[2][32];
        fprintf(f, "<tr class=\"group\"><td>");
        pt_html_text(f, json_string_value(json_object_get(g, "name")) ?: "?");
        fprintf(f, "</td><td>%lld</td><td class=\"words\">", (long long)pt_json_field(g, "size"));
        pt_html_text(f, json_string_value(json_object_get(g, "carries")) ?: "");
        double w = pt_json_field(g, "blocked_s");
        fprintf(f, "</td><td>%s</td><td>%s</td><td>%.4f</td><td>%.4f</td><td>%.1f%%</td></tr>\n",
                pt_fmt_bytes(pt_json_field(g, "bytes_per_step"), b[0], 32),
                pt_fmt_bytes(pt_json_field(g, "bytes_per_step_max"), b[1], 32), w,
                pt_json_field(g, "blocked_s_max"), step_s > 0 ? 100 * w / step_s : 0.0);
    }
    fprintf(f, "</table>\n<p class=\"note\">Per step, what a rank sent on the group (bus-bandwidth "
               "convention), the mean over the ranks and the largest rank's; the seconds a rank waited "
               "on it (mean, largest); the mean's share of the step. Groups of one rank, and groups "
               "that carried nothing, are left out.</p>\n");
}

/* The schedule report.json names, built, simulated with unit costs and drawn as `pentatron
 * schedule --svg` draws it. */
static pt_status pt_html_schedule(FILE *f, json_t *js) {
    if (!json_is_object(js)) {
        fprintf(f, "<p class=\"missing\" id=\"schedule-none\">No pipeline in this run (pp = 1): no "
                   "schedule to draw.</p>\n");
        return PT_OK;
    }
    pt_sched_kind kind;
    const char *name = json_string_value(json_object_get(js, "kind"));
    PT_TRY(pt_schedule_parse_kind(name ? name : "?", &kind));
    double head = pt_json_field(js, "head");
    pt_schedule s;
    PT_TRY(pt_schedule_build_head(&s, kind, (int)pt_json_field(js, "pp"), (int)pt_json_field(js, "microbatches"),
                                  (int)pt_json_field(js, "virtual"), isfinite(head) ? head : 0));
    pt_status st = PT_OK;
    json_t *wj = json_object_get(js, "weights");
    if (json_array_size(wj) == (size_t)(s.pp * s.v)) {
        double *w = pt_malloc(json_array_size(wj) * sizeof *w);
        for (size_t i = 0; i < json_array_size(wj); i++) w[i] = json_number_value(json_array_get(wj, i));
        st = pt_schedule_set_weights(&s, w);
        free(w);
    }
    double b = 2, w = 0;
    if (pt_schedule_splits_backward(kind)) b = w = 1;
    pt_sched_sim sim;
    if (st == PT_OK) st = pt_schedule_simulate_head(&s, 1, b, w, isfinite(head) ? head : 0, &sim);
    if (st == PT_OK) {
        fprintf(f, "<div id=\"schedule\">\n");
        pt_schedule_svg_write(&s, &sim, f);
        fprintf(f, "</div>\n<p class=\"note\">The order each pipeline rank ran its micro-batches' "
                   "forwards and backwards in one step, with unit costs (forward 1, backward 2, or "
                   "input and weight gradients 1 each), as <code>pentatron schedule</code> draws it; "
                   "the measured stage times are the metrics' <code>pp_busy</code> and "
                   "<code>pp_idle</code>.</p>\n");
        pt_sched_sim_free(&sim);
    }
    pt_schedule_free(&s);
    return st;
}

static const char *pt_css =
    "body{font-family:sans-serif;margin:24px;color:#222;max-width:1000px}"
    "h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ccc}"
    "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;"
    "text-align:right;white-space:nowrap}td:first-child,th:first-child{text-align:left}"
    "td.words,th.words{text-align:left;white-space:normal}"
    ".missing{color:#a15c00;font-style:italic}.note{color:#555;font-size:13px}"
    "svg{display:block;margin:6px 0}";

/* The page for the series and report.json (rep NULL: not written yet). */
static pt_status pt_html_page(FILE *f, const char *run, const pt_run_series *s, json_t *rep,
                              const char *rep_path) {
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>pentatron run: ");
    pt_html_text(f, run);
    fprintf(f, "</title><style>%s</style></head><body>\n<h1>Run report: ", pt_css);
    pt_html_text(f, run);
    fprintf(f, "</h1>\n<p id=\"summary\">");
    int64_t last = s->n ? (int64_t)s->step[s->n - 1] : 0;
    json_t *lay = json_object_get(rep, "layout");
    double total = pt_json_field(rep, "total_steps");
    if (lay)
        fprintf(f, "%lld rank%s = dp %lld × pp %lld × cp %lld × tp %lld, ep %lld. ",
                (long long)pt_json_field(lay, "ranks"), pt_json_field(lay, "ranks") == 1 ? "" : "s",
                (long long)pt_json_field(lay, "dp"),
                (long long)pt_json_field(lay, "pp"), (long long)pt_json_field(lay, "cp"),
                (long long)pt_json_field(lay, "tp"), (long long)pt_json_field(lay, "ep"));
    if (s->n)
        fprintf(f, "%d steps recorded, the last step %lld (loss %.4f). ", s->n, (long long)last,
                s->loss[s->n - 1]);
    if (isfinite(total) && last >= (int64_t)total)
        fprintf(f, "<span id=\"status\">Finished: %lld of %.0f steps.</span>", (long long)last, total);
    else if (isfinite(total))
        fprintf(f, "<span id=\"status\" class=\"missing\">Still going, or stopped: step %lld of %.0f.</span>",
                (long long)last, total);
    else
        fprintf(f, "<span id=\"status\" class=\"missing\">Still going, or stopped before its first run "
                   "report: step %lld.</span>", (long long)last);
    fprintf(f, "</p>\n<h2>Loss</h2>\n");
    pt_chart_series loss[] = {{"training loss", "#4c72b0", s->loss, 0},
                              {"validation loss", "#dd8452", s->val, 1}};
    pt_chart(f, "loss", "Loss per step", "loss (nats per token)", s->step, s->n, loss, s->n_val ? 2 : 1);
    if (!s->n_val)
        fprintf(f, "<p class=\"missing\" id=\"val-none\">No held-out evaluation in this run (data.val not "
                   "set, or no evaluation step reached yet).</p>\n");
    fprintf(f, "<h2>Throughput and MFU</h2>\n");
    pt_chart_series tps[] = {{"tokens/s", "#55a868", s->tps, 0}};
    pt_chart(f, "throughput", "Throughput", "tokens per second (all ranks)", s->step, s->n, tps, 1);
    pt_chart_series mfu[] = {{"MFU (measured peak)", "#c44e52", s->mfu, 0},
                             {"MFU (datasheet peak)", "#8172b3", s->mfu_ds, 0}};
    pt_chart(f, "mfu", "Model FLOPs utilisation", "MFU per rank (%)", s->step, s->n, mfu, s->has_ds ? 2 : 1);
    if (!rep) {
        fprintf(f, "<h2>Memory per rank</h2>\n<h2>Communication per group</h2>\n<h2>Pipeline schedule</h2>\n"
                   "<p class=\"missing\" id=\"report-none\">");
        pt_html_text(f, rep_path);
        fprintf(f, " is not written yet: the trainer writes it at every run report (logging.report_every) "
                   "and at the end of the run.</p>\n</body></html>\n");
        return PT_OK;
    }
    double first = pt_json_field(rep, "first_step"), upto = pt_json_field(rep, "last_step");
    double step_s = pt_json_field(rep, "seconds") / fmax(1, upto - first + 1);
    fprintf(f, "<h2>Memory per rank</h2>\n<p class=\"note\">At step %.0f.</p>\n", upto);
    pt_html_memory(f, json_object_get(rep, "ranks"));
    fprintf(f, "<h2>Communication per group</h2>\n<p class=\"note\">Steps %.0f to %.0f, %.3f s per step.</p>\n",
            first, upto, step_s);
    pt_html_groups(f, json_object_get(rep, "groups"), step_s);
    fprintf(f, "<h2>Pipeline schedule</h2>\n");
    PT_TRY(pt_html_schedule(f, json_object_get(rep, "schedule")));
    fprintf(f, "</body></html>\n");
    return PT_OK;
}

/* RUN as the metrics file and the directory it lies in; PT_ERR_IO when it is neither a directory
 * holding metrics.jsonl nor a regular file. */
static pt_status pt_report_locate(const char *run, char *metrics, char *dir, size_t cap) {
    struct stat st;
    if (stat(run, &st) != 0)
        return pt_errorf(PT_ERR_IO, "report: %s: %s (RUN is the directory of logging.metrics or the "
                         "metrics file)", run, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        snprintf(dir, cap, "%s", run);
        snprintf(metrics, cap, "%s/metrics.jsonl", run);
        if (stat(metrics, &st) != 0 || !S_ISREG(st.st_mode))
            return pt_errorf(PT_ERR_IO, "report: %s is not a run: it holds no metrics.jsonl (RUN is the "
                             "directory of logging.metrics or the metrics file)", run);
        return PT_OK;
    }
    if (!S_ISREG(st.st_mode))
        return pt_errorf(PT_ERR_IO, "report: %s is not a run: not a directory or a regular file", run);
    snprintf(metrics, cap, "%s", run);
    snprintf(dir, cap, "%s", run);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, cap, ".");
    return PT_OK;
}

int pt_cmd_report(int argc, char **argv) {
    const char *run = NULL, *out_opt = NULL;
    pt_status st = PT_OK;
    for (int i = 0; i < argc && st == PT_OK; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            pt_report_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--out") && i + 1 == argc)
            st = pt_errorf(PT_ERR_CONFIG, "report: --out needs a file");
        else if (!strcmp(argv[i], "--out")) out_opt = argv[++i];
        else if (argv[i][0] == '-' && argv[i][1])
            st = pt_errorf(PT_ERR_CONFIG, "report: %s is not an option (see --help)", argv[i]);
        else if (run)
            st = pt_errorf(PT_ERR_CONFIG, "report: one RUN expected, got \"%s\" and \"%s\"", run, argv[i]);
        else run = argv[i];
    }
    if (st == PT_OK && !run)
        st = pt_errorf(PT_ERR_CONFIG, "report: which run? (pentatron report RUN; see --help)");
    char metrics[4096], dir[4096], out[4200], rep_path[4200];
    if (st == PT_OK) st = pt_report_locate(run, metrics, dir, sizeof metrics);
    if (st == PT_OK) {
        snprintf(out, sizeof out, "%s", out_opt ? out_opt : "");
        if (!out_opt) snprintf(out, sizeof out, "%s/report.html", dir);
        snprintf(rep_path, sizeof rep_path, "%s/report.json", dir);
        st = pt_check_output(out, 0, "report --out");
        struct stat a, b; /* the page never replaces what it is made from */
        if (st == PT_OK && stat(out, &a) == 0 && stat(metrics, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino)
            st = pt_errorf(PT_ERR_IO, "report: the page would replace the metrics %s (give --out FILE)",
                           metrics);
    }
    pt_run_series s;
    if (st == PT_OK) st = pt_read_metrics(metrics, &s);
    if (st != PT_OK) {
        pt_log_error("%s", pt_last_error());
        return pt_cli_exit(st, 0);
    }
    json_t *rep = NULL;
    struct stat rs;
    if (stat(rep_path, &rs) == 0) {
        json_error_t err;
        rep = json_load_file(rep_path, 0, &err);
        if (!json_is_object(rep) || !json_is_object(json_object_get(rep, "layout")) ||
            !json_is_array(json_object_get(rep, "ranks")))
            st = pt_errorf(PT_ERR_FORMAT, "report: %s is not the run report's data (line %d: %s)", rep_path,
                           err.line, rep ? "not the fields the trainer writes" : err.text);
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = st == PT_OK ? open_memstream(&buf, &len) : NULL;
    if (st == PT_OK && !f) st = pt_errorf(PT_ERR_MEMORY, "report: cannot buffer the page");
    if (f) {
        st = pt_html_page(f, run, &s, rep, rep_path);
        fclose(f);
    }
    if (st == PT_OK) st = pt_write_file_atomic(out, buf, len);
    free(buf);
    json_decref(rep);
    pt_series_free(&s);
    if (st != PT_OK) {
        pt_log_error("%s", pt_last_error());
        return pt_cli_exit(st, 0);
    }
    printf("%s\n", out);
    return 0;
}
