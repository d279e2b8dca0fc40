#!/usr/bin/env python3
"""Lists a crate's public API from rustdoc's HTML output (stable rustdoc; no JSON needed).

Usage: public-api.py DOC_DIR CRATE_PATH_NAME (e.g. target/doc/kvsched_testkit kvsched_testkit).

Reads DOC_DIR/all.html (every public item at its public path) and each item's
page: inherent methods and associated constants, fields, variants, trait methods, and the
traits each type implements (auto traits such as Send and Sync included, so losing one is a
visible change). Blanket implementations are left out. One line per entry, sorted within
each item, items sorted by path.
"""
import html
import re
import sys
from pathlib import Path

doc = Path(sys.argv[1] if len(sys.argv) > 1 else "target/doc/kvsched")
crate = sys.argv[2] if len(sys.argv) > 2 else doc.name
all_items = (doc / "all.html").read_text()

TAG = re.compile(r"<[^>]+>")


def text(fragment: str) -> str:
    return " ".join(html.unescape(TAG.sub("", fragment)).split())


def section(page: str, sid: str) -> str:
    start = page.find(f'id="{sid}"')
    if start < 0:
        return ""
    ends = [page.find(f'id="{o}"', start + 1) for o in (
        "implementations-list", "trait-implementations-list",
        "synthetic-implementations-list", "blanket-implementations-list",
        "implementations", "trait-implementations", "synthetic-implementations",
        "blanket-implementations", "implementors", "dyn-compatibility")]
    ends = [e for e in ends if e > start]
    return page[start: min(ends) if ends else len(page)]


# Of the auto traits, those an embedder relies on.
AUTO = {"Send", "Sync"}

out = []
kinds = {"struct": "struct", "enum": "enum", "trait": "trait", "fn": "fn", "constant": "const",
         "type": "type", "macro": "macro", "union": "union", "static": "static"}
for href in sorted(set(re.findall(r'<li><a href="([^"]+\.html)">', all_items))):
    kind = href.rsplit("/", 1)[-1].split(".", 1)[0]
    name = href.rsplit("/", 1)[-1].split(".", 1)[1][: -len(".html")]
    path = crate + "::" + "::".join(href.split("/")[:-1] + [name])
    page = (doc / href).read_text()
    out.append(f"{kinds.get(kind, kind)} {path}")
    entries = set()
    for f in re.findall(r'id="structfield\.([A-Za-z0-9_]+)"', page):
        entries.add(f"field {f}")
    for v in re.findall(r'id="variant\.([A-Za-z0-9_]+)"', page):
        entries.add(f"variant {v}")
    if kind == "trait":
        for m in re.findall(r'id="(?:tymethod|method)\.([A-Za-z0-9_]+)"', page):
            entries.add(f"method {m}")
    inherent = section(page, "implementations-list")
    for m in re.findall(r'id="method\.([A-Za-z0-9_]+)"', inherent):
        entries.add(f"method {m}")
    for c in re.findall(r'id="associatedconstant\.([A-Za-z0-9_]+)"', inherent):
        entries.add(f"const {c}")
    for sid in ("trait-implementations-list", "synthetic-implementations-list"):
        for header in re.findall(r'<h3 class="code-header">(.*?)</h3>', section(page, sid)):
            head = text(header)
            trait = head.split(" for ", 1)[0]
            trait = re.sub(r"^impl(<.*?>)?\s*", "", trait)
            if sid == "synthetic-implementations-list" and trait.lstrip("!") not in AUTO:
                continue
            entries.add(f"impl {trait}")
    out.extend(f"    {e}" for e in sorted(entries))
print("\n".join(out))
