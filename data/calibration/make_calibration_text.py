#!/usr/bin/env python3
"""Build pdq-calibration.txt: the opening chapter(s) of each of Jane Austen's
six novels, in publication order, about TARGET characters each, as plain
UTF-8 prose with one paragraph per line.

Input: the novels as extracted by extract_austen.py (one file per novel,
Project Gutenberg's hard-wrapped lines). Cleaning: hard-wrapped lines of a
paragraph are joined with single spaces (no space after a line-final "--"), runs of spaces collapse to one,
Gutenberg's _italic_ underscores are dropped, "--" becomes an em dash,
chapter headings stay as their own lines, and each excerpt ends at a
paragraph boundary once it holds TARGET characters."""
import re, sys

TARGET = int(sys.argv[3]) if len(sys.argv) > 3 else 7000
# (file from extract_austen.py, title, first line of the excerpt)
NOVELS = [
    ('novel5.txt', 'Sense and Sensibility (1811)', 'CHAPTER 1'),
    ('novel4.txt', 'Pride and Prejudice (1813)', 'Chapter 1'),
    ('novel1.txt', 'Mansfield Park (1814)', 'CHAPTER I'),
    ('novel0.txt', 'Emma (1815)', 'CHAPTER I'),
    ('novel2.txt', 'Northanger Abbey (1818)', 'CHAPTER 1'),
    ('novel3.txt', 'Persuasion (1818)', 'Chapter 1'),
]

def paragraphs(lines):
    para = []
    for line in lines:
        if line.strip():
            para.append(line.strip())
        elif para:
            yield '\n'.join(para); para = []
    if para:
        yield '\n'.join(para)

def clean(p):
    p = p.replace('_', '')
    p = re.sub(r'--\n', '\u2014', p)  # a dash that ended a wrapped line
    p = p.replace('--', '\u2014')
    p = re.sub(r'\s+', ' ', p).strip()
    return p

def main(src_dir, out_path):
    out = []
    for fname, title, start in NOVELS:
        lines = open(f'{src_dir}/{fname}', encoding='utf-8').read().split('\n')
        i = next(k for k, l in enumerate(lines) if l.strip() == start)
        out.append(f'{title.split(" (")[0]}, by Jane Austen')
        n = 0
        for p in paragraphs(lines[i:]):
            p = clean(p)
            if re.fullmatch(r'(?i)chapter [0-9ivxl]+', p):
                p = p.title()
            out.append(p); n += len(p)
            if n >= TARGET:
                break
    text = '\n\n'.join(out) + '\n'
    open(out_path, 'w', encoding='utf-8').write(text)
    print(f'{out_path}: {len(text.encode())} bytes, {len(out)} paragraphs', file=sys.stderr)

if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2])
