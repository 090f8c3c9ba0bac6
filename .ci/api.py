#!/usr/bin/env python3
"""The public API of each library module, as a sorted list, against its baseline in api/.

Reads the symbol graphs that `swift package generate-documentation` (.ci/docs) extracted, so the
modules are built and their symbols extracted once for both. One line per public declaration:
its kind, its path, and its declaration as the compiler prints it (with the constraints of the
extension it is in); one line per conformance. Members the compiler synthesizes from a protocol's
default implementations (`!=`, `hashValue`, …) are left out: the conformance line stands for them.

    python3 .ci/api.py check     # exit 1 with a diff when the surface differs from api/*.txt
    python3 .ci/api.py update    # rewrite api/*.txt from the symbol graphs
    python3 .ci/api.py missing   # public declarations without a doc comment

`check` also holds the error model (docs/errors-and-validation.md, "Typed throws"): every public throwing declaration of
Strata's own modules throws `StrataError` (typed), except where a caller's or a protocol's errors
must pass through: Codable's requirements, APIs that take a throwing closure (the closure's errors
reach the caller unchanged), and the sync transports (`SyncTransport` is implemented by apps, and
`ResetRequired` is a transport's signal).
"""
import difflib
import glob
import json
import os
import re
import sys

MODULES = ["Strata", "StrataSync", "StrataTesting", "LMDB", "StrataWorkload"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def symbol_graphs(module):
    # .build/<triple>/extracted-symbols/<package identity>/<module>/<module>[@Other].symbols.json;
    # the package identity is the checkout's folder name, so it is globbed.
    files = glob.glob(os.path.join(ROOT, ".build", "*", "extracted-symbols", "*", module, "*.symbols.json"))
    if not files:
        sys.exit(f"api: no symbol graph for {module}; run `bash .ci/docs` (it extracts them) first")
    newest = max(os.path.getmtime(f) for f in files)
    # Only the latest extraction (another checkout's identity may have left older ones).
    return [f for f in files if newest - os.path.getmtime(f) < 600]


def declaration(symbol):
    text = "".join(f["spelling"] for f in symbol.get("declarationFragments", []))
    constraints = symbol.get("swiftExtension", {}).get("constraints", [])
    if constraints:
        kinds = {"conformance": ":", "superclass": ":", "sameType": "=="}
        text += " where " + ", ".join(
            f'{c["lhs"]} {kinds.get(c["kind"], c["kind"])} {c["rhs"]}' for c in constraints)
    return " ".join(text.split())


def surface(module):
    lines, undocumented = set(), []
    for path in symbol_graphs(module):
        graph = json.load(open(path))
        names = {}
        for s in graph["symbols"]:
            precise = s["identifier"]["precise"]
            names[precise] = ".".join(s["pathComponents"])
            if "::SYNTHESIZED::" in precise:
                continue
            name = ".".join(s["pathComponents"])
            lines.add(f'{s["kind"]["identifier"].removeprefix("swift.")} {name}: {declaration(s)}')
            # Declarations the compiler writes (a Codable init, a raw-value init) have no location
            # and no comment to write.
            if "docComment" not in s and "location" in s:
                loc = s["location"]
                undocumented.append(f'{loc["uri"].removeprefix("file://")}:{loc["position"]["line"] + 1}: {name}')
        for r in graph["relationships"]:
            if r["kind"] == "conformsTo" and r["source"] in names:
                target = names.get(r["target"]) or r.get("targetFallback") or r["target"]
                lines.add(f'conformance {names[r["source"]]}: {target}')
    return sorted(lines), sorted(undocumented)


TYPED_MODULES = ["Strata", "StrataSync", "StrataTesting", "StrataWorkload"]
TRANSPORTS = ("SyncTransport.", "HTTPSyncTransport.", "InMemorySyncServer.", "SyncClient.sync(with:")


def untyped_throws(lines):
    """Declarations that throw untyped but are not one of the exceptions above."""
    found = []
    for line in lines:
        decl = line.split(": ", 1)[1] if ": " in line else line
        if not re.search(r"\bthrows\b(?!\()", decl.split(" where ")[0].rsplit(")", 1)[-1] if ")" in decl else decl):
            continue
        name = line.split(" ", 1)[1]
        if "init(from decoder: any Decoder)" in decl or "encode(to encoder: any Encoder)" in decl:
            continue
        params = decl[decl.find("("):decl.rfind(")") + 1] if "(" in decl else ""
        if re.search(r"\bthrows\b(?!\()", params):
            continue  # takes a throwing closure
        if name.startswith(TRANSPORTS) or any(t in name for t in (".pull(since:)", ".push(_:)", ".health()")):
            continue
        found.append(line)
    return found


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "check"
    failed = False
    for module in MODULES:
        lines, undocumented = surface(module)
        baseline = os.path.join(ROOT, "api", f"{module}.txt")
        if mode == "update":
            os.makedirs(os.path.dirname(baseline), exist_ok=True)
            with open(baseline, "w") as f:
                f.write("\n".join(lines) + "\n")
            print(f"api: {module}: {len(lines)} lines written to api/{module}.txt")
        elif mode == "missing":
            print("\n".join(undocumented))
        else:
            old = open(baseline).read().splitlines() if os.path.exists(baseline) else []
            if old != lines:
                failed = True
                sys.stdout.writelines(l + "\n" for l in difflib.unified_diff(
                    old, lines, f"api/{module}.txt (baseline)", f"{module} (this build)", lineterm="", n=0))
            else:
                print(f"api: {module}: {len(lines)} lines, as in api/{module}.txt")
            if module in TYPED_MODULES:
                for line in untyped_throws(lines):
                    failed = True
                    print(f"api: {module}: throws untyped, not StrataError: {line}")
    if failed:
        print("\napi: the public API differs from its baseline (above: - removed, + added).\n"
              "If the change is deliberate, update the baseline and commit it with the change:\n"
              "    bash .ci/docs --update-api")
        sys.exit(1)


if __name__ == "__main__":
    main()
