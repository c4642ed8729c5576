#!/usr/bin/python3
"""deps_graph.py: the dependency checks of tests/test_deps.sh (which holds the rule table).

    deps_graph.py --src SRC --build BUILD --layers TEXT --rules TEXT [--optional GLOBS]

Builds two graphs over the project's files (paths relative to SRC):
  includes: FILE -> HEADER for every #include in src/**/*.{c,cu,h} and include/**/*.h ("pt/x.h" is
            include/pt/x.h, "dir/x.h" is src/dir/x.h, then relative to the including file; a
            <x.h> that is not a project file is a system node "<x.h>");
  symbols:  A.c -> B.c when A.c's object uses (nm: U) a global symbol that B.c's object defines;
            the objects are BUILD/CMakeFiles/pentatron_core.dir/src/**.{c,cu}.o and
            BUILD/CMakeFiles/pentatron.dir/src/**.c.o (the executable's main.c).
and checks the rules on them (see test_deps.sh). Prints "ok   [ID] ..." or one "FAIL [ID] ..."
line per violation, then "N passed, M failed"; exits 1 if anything failed.
"""
import argparse
import fnmatch
import os
import re
import subprocess
import sys
from collections import defaultdict, deque


def parse_layers(text):
    layers = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, *globs = line.split()
            layers[name] = globs
    return layers


def parse_rules(text):
    rules = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.match(r"\s*(.*?)\s+:\s+(.*)$", line)
        head, why = (m.group(1), m.group(2).strip()) if m else (line.strip(), "")
        rid, method, files, *targets = head.split()
        rules.append(dict(id=rid, method=method, files=files, targets=targets, why=why))
    return rules


class Checker:
    def __init__(self):
        self.results = []  # (id, passed)
        self.failed = 0

    def check(self, rid, title, violations, vacuous=()):
        """One check: passes when there is no violation and nothing makes it vacuous."""
        for v in vacuous:
            print(f"FAIL [{rid}] vacuous: {v}")
        for v in violations:
            print(f"FAIL [{rid}] {v}")
        ok = not violations and not vacuous
        if ok:
            print(f"ok   [{rid}] {title}")
        elif violations:
            print(f"     [{rid}] {len(violations)} violation(s) of: {title}")
        else:
            print(f"     [{rid}] cannot check: {title}")
        self.results.append((rid, ok))
        return ok


# ---------------------------------------------------------------- the include graph

INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)


def strip_comments(text):
    """Blank out /* */ and // comments, keeping the line numbers."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group().count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def project_files(src):
    files = []
    for top, exts in (("src", (".c", ".cu", ".h")), ("include", (".h",))):
        for d, _, names in os.walk(os.path.join(src, top)):
            files += [os.path.relpath(os.path.join(d, n), src) for n in names if n.endswith(exts)]
    return sorted(files)


def include_graph(src, files):
    """edges[f] = {target: line}; unresolved = ['file:line "name"'] (quoted, not a project file)."""
    fileset = set(files)
    edges, unresolved = {}, []
    for f in files:
        with open(os.path.join(src, f), encoding="utf-8", errors="replace") as fh:
            text = strip_comments(fh.read())
        edges[f] = {}
        for m in INCLUDE.finditer(text):
            form, name = m.group(1), m.group(2).strip()
            line = text.count("\n", 0, m.start()) + 1
            cands = [os.path.normpath(os.path.join("include", name)) if name.startswith("pt/") else None,
                     os.path.normpath(os.path.join("src", name)),
                     os.path.normpath(os.path.join(os.path.dirname(f), name)) if form == '"' else None,
                     os.path.normpath(os.path.join("include", name))]
            target = next((c for c in cands if c in fileset), None)
            if target is None:
                if form == '"':
                    unresolved.append(f'{f}:{line} includes "{name}", which is not a project file')
                    continue
                target = f"<{name}>"
            edges[f].setdefault(target, line)
    return edges, unresolved


# ---------------------------------------------------------------- the symbol graph

def find_objects(build, sources, optional=()):
    """{source: object} for the project's .c and .cu files; problems = [str]; notes = [str]. A
    source matching an `optional` glob may have no object (the build's configuration leaves it
    out: the CUDA backend's .cu files without the toolkit, absent.c with it): a note."""
    found = defaultdict(list)
    for target in ("pentatron_core.dir", "pentatron.dir"):
        top = os.path.join(build, "CMakeFiles", target)
        for d, _, names in os.walk(top):
            for n in names:
                if n.endswith((".c.o", ".cu.o")):
                    obj = os.path.join(d, n)
                    found[os.path.relpath(obj, top)[:-2]].append(obj)
    objects, problems, notes = {}, [], []
    if not found:
        return objects, problems, notes  # S2 says "no object file found", once
    for s in sources:
        objs = found.pop(s, [])
        if not objs and any(fnmatch.fnmatch(s, g) for g in optional):
            notes.append(f"note: {s} is not in this build (configured out)")
            continue
        if not objs:
            problems.append(f"{s} has no object file under {build}/CMakeFiles/pentatron{{_core,}}.dir (not built?)")
            continue
        obj = max(objs, key=os.path.getmtime)
        objects[s] = obj
    for s, objs in sorted(found.items()):
        notes.append(f"note: ignored {os.path.relpath(objs[0], build)}: its source {s} does not exist (stale)")
    return objects, problems, notes


def nm_symbols(obj):
    """(defined, undefined) global symbol names of an object file."""
    out = subprocess.run(["nm", "-P", "-g", obj], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip() or f"nm exited {out.returncode}")
    defined, undefined = set(), set()
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind in "Uw":
            undefined.add(name)
        elif kind.isupper() or kind in "viu":
            defined.add(name)
    return defined, undefined


# ---------------------------------------------------------------- graph algorithms

def sccs(nodes, succ):
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(succ(root))))]
        index[root] = low[root] = n; n += 1; stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n; n += 1; stack.append(w); on.add(w)
                    work.append((w, iter(sorted(succ(w)))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def shortest_path(start, goals, succ, allowed=None):
    """BFS path start..g (list of nodes) to the nearest g in goals, or None."""
    prev, q = {start: None}, deque([start])
    while q:
        v = q.popleft()
        for w in sorted(succ(v)):
            if allowed is not None and w not in allowed:
                continue
            if w in goals:
                path = [w, v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1]
            if w not in prev:
                prev[w] = v
                q.append(w)
    return None


def cycles_in(nodes, succ):
    """One shortest cycle through each node of each non-trivial SCC, without rotations."""
    found, seen = [], set()
    for comp in sccs(sorted(nodes), succ):
        members = set(comp)
        if len(comp) == 1 and comp[0] not in succ(comp[0]):
            continue
        for v in comp:
            cyc = shortest_path(v, {v}, succ, members)
            key = frozenset(zip(cyc, cyc[1:]))
            if key not in seen:
                seen.add(key)
                found.append((comp, cyc))
    return found


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--layers", required=True)
    ap.add_argument("--rules", required=True)
    ap.add_argument("--optional", default="", help="globs of sources a configuration may leave out")
    a = ap.parse_args()
    layers, rules = parse_layers(a.layers), parse_rules(a.rules)
    ck = Checker()

    # S1: the sources and the include graph
    files = project_files(a.src)
    sources = [f for f in files if f.startswith("src/") and f.endswith((".c", ".cu"))]
    headers = [f for f in files if f.endswith(".h")]
    inc, unresolved = include_graph(a.src, files)
    n_inc = sum(1 for f in inc for t in inc[f] if not t.startswith("<"))
    vac = []
    if not sources:
        vac.append(f"no src/**/*.c under {a.src}")
    if not [h for h in headers if h.startswith("include/")]:
        vac.append(f"no include/**/*.h under {a.src}")
    if n_inc == 0:
        vac.append("no #include of a project header found: the include graph is empty")
    for name, globs in layers.items():
        vac += [f"layer '{name}': {g} matches no file" for g in globs
                if not any(fnmatch.fnmatchcase(f, g) for f in files)]
    ck.check("S1", f"{len(sources)} sources, {len(headers)} headers, {n_inc} project #includes parsed",
             unresolved, vac)

    # S2: one up-to-date object per source; S3: the symbol graph
    objects, problems, notes = find_objects(a.build, sources, a.optional.split())
    for n in notes:
        print(n)
    defs, undefs = {}, {}
    for s, obj in sorted(objects.items()):
        # out of date like make sees it: older than its source or a project header it includes
        seen, frontier = {s}, [s]
        while frontier:
            for w in inc.get(frontier.pop(), {}):
                if w not in seen and not w.startswith("<"):
                    seen.add(w)
                    frontier.append(w)
        newer = sorted(f for f in seen if os.path.getmtime(os.path.join(a.src, f)) > os.path.getmtime(obj))
        if newer:
            problems.append(f"{os.path.relpath(obj, a.build)} is older than {', '.join(newer)}: rebuild first")
        try:
            defs[s], undefs[s] = nm_symbols(obj)
        except (OSError, RuntimeError) as e:
            problems.append(f"nm {obj}: {e}")
            continue
        if any(x.startswith("__gnu_lto_") for x in defs[s] | undefs[s]):
            problems.append(f"{obj} is an LTO object: nm cannot see its symbols (build without -flto)")
        elif not defs[s] and not undefs[s]:
            problems.append(f"{obj} has no global symbol at all (nm)")
    vac = [] if objects else [f"no object file found under {a.build}/CMakeFiles/pentatron_core.dir"]
    ck.check("S2", f"{len(objects)} object files, one per source, up to date", problems, vac)

    definers = defaultdict(set)
    for s, d in defs.items():
        for sym in d:
            definers[sym].add(s)
    sym_edges = defaultdict(lambda: defaultdict(set))  # A -> B -> {symbols}
    for s, u in undefs.items():
        for sym in u:
            for b in definers.get(sym, ()):
                if b != s:
                    sym_edges[s][b].add(sym)
    n_sym = sum(len(v) for v in sym_edges.values())
    vac = [] if n_sym else ["no object uses a symbol of another: the symbol graph is empty"]
    ck.check("S3", f"symbol graph: {len(defs)} objects, {len(definers)} defined symbols, {n_sym} file edges",
             [], vac)

    def members(layer):
        return {f for f in files if any(fnmatch.fnmatchcase(f, g) for g in layers[layer])}

    def subject(spec):
        if spec == "*":
            return set(files)
        name = spec[1:] if spec.startswith("!") else spec
        if name not in layers:
            raise SystemExit(f"deps_graph: unknown layer '{name}' in the rule table")
        m = members(name)
        return set(files) - m if spec.startswith("!") else m

    def syms(names, n=6):
        names = sorted(names)
        return ", ".join(names[:n]) + (f", ... (+{len(names) - n})" if len(names) > n else "")

    inc_succ = lambda v: inc.get(v, {}).keys()
    sym_succ = lambda v: sym_edges.get(v, {}).keys()

    for r in rules:
        rid, method, targets = r["id"], r["method"], r["targets"]
        subj = subject(r["files"])
        what = {"includes": "must not #include (directly or through headers)",
                "symbols": "must not use symbols of", "include-cycles": "no #include cycle among",
                "symbol-cycles": "no cycle of symbol uses among"}.get(method, method)
        if method.endswith("cycles"):
            title = f"{what} {'all files' if r['files'] == '*' else r['files']}"
        else:
            who = f"files outside {r['files'][1:]}" if r["files"].startswith("!") else r["files"]
            title = f"{who} {what} {', '.join(targets)}"
        title += f": {r['why']}" if r["why"] else ""
        violations, vac = [], []
        if method == "includes":
            if not subj:
                vac.append(f"'{r['files']}' matches no file")
            goal_of = {}
            for t in targets:
                if t.startswith("<"):
                    if not any(t in inc[f] for f in files):
                        vac.append(f"no project file includes {t}: check the rule")
                    goal_of[t] = t
                else:
                    m = members(t)
                    if not m:
                        vac.append(f"layer '{t}' matches no file")
                    for f in m:
                        goal_of.setdefault(f, t)
            for f in sorted(subj):
                # every forbidden file reachable from f, each by its shortest chain
                prev, q, hits = {f: None}, deque([f]), []
                while q:
                    v = q.popleft()
                    for w in sorted(inc_succ(v)):
                        if w not in prev:
                            prev[w] = v
                            if w in goal_of and w not in subj:
                                hits.append(w)  # reported; what it includes in turn is not
                            else:
                                q.append(w)
                for h in hits:
                    path = [h]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    path = path[::-1]
                    chain = " -> ".join(f"{p}:{inc[p][q]}" for p, q in zip(path, path[1:])) + f" -> {h}"
                    violations.append(chain + (f"   [{goal_of[h]}]" if goal_of[h] != h else ""))
        elif method == "symbols":
            objs = sorted(s for s in subj if s in defs)
            reported = set()  # (object, symbol): a symbol is reported once per object
            if not objs:
                vac.append(f"'{r['files']}' has no object file")
            for t in sorted(targets, key=lambda t: t.startswith("/")):  # layers first
                if t.startswith("/"):
                    rx = re.compile(t.strip("/"))
                    if not any(rx.search(x) for s in defs for x in defs[s] | undefs[s]):
                        vac.append(f"{t} matches no symbol of any object: check the rule")
                    for s in objs:
                        hit = {x for x in undefs[s] if rx.search(x) and (s, x) not in reported}
                        reported |= {(s, x) for x in hit}
                        if hit:
                            where = sorted({b for x in hit for b in definers.get(x, ())})
                            where = f"defined in {', '.join(where)}" if where else "outside the project"
                            violations.append(f"{s} uses {syms(hit)}   [{t}, {where}]")
                else:
                    m = members(t)
                    if not any(x in defs and defs[x] for x in m):
                        vac.append(f"layer '{t}' has no object defining a symbol")
                    for s in objs:
                        for b in sorted(sym_edges.get(s, {})):
                            if b in m and b not in subj:
                                reported |= {(s, x) for x in sym_edges[s][b]}
                                violations.append(f"{s} uses {syms(sym_edges[s][b])} defined in {b}   [{t}]")
        elif method in ("include-cycles", "symbol-cycles"):
            succ0 = inc_succ if method == "include-cycles" else sym_succ
            nodes = {f for f in subj if any(w in subj for w in succ0(f))}
            if not nodes:
                vac.append("the graph has no edge among these files")
            succ = lambda v, s0=succ0: [w for w in s0(v) if w in subj]
            for comp, cyc in cycles_in(nodes, succ):
                if method == "include-cycles":
                    chain = " -> ".join(f"{p}:{inc[p][q]}" for p, q in zip(cyc, cyc[1:])) + f" -> {cyc[-1]}"
                else:
                    chain = cyc[0] + "".join(f" -> {q} ({syms(sym_edges[p][q], 3)})" for p, q in zip(cyc, cyc[1:]))
                extra = f"   [one of the cycles among these {len(comp)} files: {' '.join(comp)}]" if len(comp) > len(cyc) - 1 else ""
                violations.append(f"cycle: {chain}{extra}")
        else:
            raise SystemExit(f"deps_graph: unknown method '{method}' in rule {rid}")
        ck.check(rid, title, violations, vac)

    passed = sum(1 for _, ok in ck.results if ok)
    failed = len(ck.results) - passed
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
