#!/usr/bin/env python3
"""Turns the output of `bible gen1:1-rev22:21` (Debian bible-kjv) into plain text: one verse per
line, chapters separated by a blank line, references stripped. Jude and Revelation are held out."""
import argparse
import re
import subprocess

HEADING = re.compile(r"^(?:[1-3] )?[A-Z][A-Za-z ]+ \d+$")   # "Genesis 1", "1 Kings 3", "Song of Solomon 2"
VERSE = re.compile(r"^\s+\d+ (.*)$")
HELD_OUT = ("Jude", "Revelation")


def parse(lines):
    """Yields (book, chapter_text) with one verse per line."""
    book, verses = None, []
    for line in lines:
        line = line.rstrip("\n")
        if HEADING.match(line):
            if verses:
                yield book, "\n".join(verses)
            book, verses = line.rsplit(" ", 1)[0], []
        elif (m := VERSE.match(line)):
            verses.append(m.group(1).strip())
        elif line.strip() and verses:
            verses[-1] += " " + line.strip()   # continuation of a wrapped verse
    if verses:
        yield book, "\n".join(verses)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--heldout", required=True)
    args = ap.parse_args()
    text = subprocess.run(["bible", "gen1:1-rev22:21"], check=True, capture_output=True,
                          text=True).stdout
    train, held = [], []
    for book, chapter in parse(text.splitlines()):
        (held if book in HELD_OUT else train).append(chapter)
    for path, chapters in ((args.train, train), (args.heldout, held)):
        with open(path, "w") as f:
            f.write("\n\n".join(chapters) + "\n")
        print(f"{path}: {len(chapters)} chapters, {sum(map(len, chapters))} chars")


if __name__ == "__main__":
    main()
