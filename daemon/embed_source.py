#!/usr/bin/env python3
"""Writes a C++ header holding a source file as a string_view NAME in namespace
elasticrun::daemon, so that elasticrund
carries its fork server (fork_server.py) inside its binary: the same from the build
directory as after `meson install`.

    embed_source.py INPUT OUTPUT NAME"""
import sys

DELIMITER = "er_embedded"  # at most 16 characters


def main():
    src, out, name = sys.argv[1:]
    with open(src, encoding="utf-8") as f:
        text = f.read()
    if f"){DELIMITER}\"" in text:
        sys.exit(f"embed_source.py: {src} contains the raw string's end, '){DELIMITER}\"'")
    with open(out, "w", encoding="utf-8") as f:
        f.write(f"// Generated from {src} by daemon/embed_source.py: do not edit.\n"
                "#pragma once\n#include <string_view>\nnamespace elasticrun::daemon {\n"
                f"inline constexpr std::string_view {name} = R\"{DELIMITER}({text}){DELIMITER}\";\n"
                "}  // namespace elasticrun::daemon\n")


if __name__ == "__main__":
    main()
