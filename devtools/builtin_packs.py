"""The built-in packs as parsed, and what the compiler needs of each regex besides compiling it
(`patterns.compiler.regex_facts`), for a fast start (`patterns/packs.json`, read by `patterns.loader`).

    python -m devtools.builtin_packs            # write it
    python -m devtools.builtin_packs --check    # exit 1 when it is not current

Each entry holds a pack file's parse and the SHA-256 of the text it came from; the loader uses an entry
only when the file's text still has that digest, so a stale file costs time, never correctness."""

from __future__ import annotations

import argparse
import json
import sys

from faultline import yamldoc
from patterns import compiler, loader


def render() -> str:
    out = {}
    for path in loader.pack_files(loader.BUILTIN_DIR):
        text = path.read_text(encoding="utf-8")
        doc = yamldoc.parse(text)
        if json.loads(json.dumps(doc)) != doc:
            raise SystemExit(f"{path.name}: its parse is not plain JSON data")
        facts = {
            pattern["id"]: compiler.regex_facts(pattern["regex"], bool(pattern.get("ignore_case", False)))
            for pattern in doc.get("patterns") or []
            if isinstance(pattern, dict) and isinstance(pattern.get("regex"), str)
        }
        out[path.name] = {"sha256": loader.text_digest(text), "doc": doc, "facts": facts}
    return json.dumps(out, sort_keys=True, separators=(",", ":")) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when packs.json is not current")
    args = parser.parse_args()
    text = render()
    current = loader.BUILTIN_PARSED.read_text(encoding="utf-8") if loader.BUILTIN_PARSED.exists() else ""
    if args.check:
        if current != text:
            sys.exit(f"{loader.BUILTIN_PARSED.name} is not current: run `python -m devtools.builtin_packs`")
        return
    loader.BUILTIN_PARSED.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
