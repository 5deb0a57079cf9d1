#!/usr/bin/env python3
"""Renders every (template, conversation) pair of tests/data/chat with Python's transformers
(apply_chat_template on a tokenizer whose special tokens match the template's model) and writes
the goldens that tests/test_chat_template.cpp compares minfer's Jinja interpreter against.

  python3 tools/chat-goldens/render.py [--out DIR] [--jinja-only]

Without transformers (or with --jinja-only) it builds the same sandboxed Jinja2 environment
transformers uses (trim_blocks, lstrip_blocks, loopcontrols, its tojson and raise_exception).
A template that raises gives "ERROR: <message>" (raise_exception) or
"EXCEPTION: <type>: <message>" (any other failure) as its golden.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "tests", "data", "chat")


def jinja_renderer():
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from datetime import datetime

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)

    def render(template, conv, special):
        kwargs = {k: v for k, v in special.items() if v is not None}
        kwargs.update(conv.get("extra", {}))
        return env.from_string(template).render(
            messages=conv["messages"], tools=conv.get("tools"),
            add_generation_prompt=conv["add_generation_prompt"], **kwargs)

    return render, "jinja2 %s (transformers-equivalent environment)" % jinja2.__version__


def transformers_renderer():
    import transformers
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    def render(template, conv, special):
        vocab = {"[UNK]": 0}
        for tok in special.values():
            if tok is not None:
                vocab.setdefault(tok, len(vocab))
        tok = PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="[UNK]")), unk_token=None,
            **{k: v for k, v in special.items() if v is not None})
        tok.chat_template = template
        # apply_chat_template also passes unk_token when set; none of these templates has one.
        return tok.apply_chat_template(
            conv["messages"], tools=conv.get("tools"), tokenize=False,
            add_generation_prompt=conv["add_generation_prompt"], **conv.get("extra", {}))

    return render, "transformers %s apply_chat_template" % transformers.__version__


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(DATA, "golden"))
    ap.add_argument("--jinja-only", action="store_true")
    args = ap.parse_args()

    render, how = None, None
    if not args.jinja_only:
        try:
            render, how = transformers_renderer()
        except ImportError as e:
            print("transformers unavailable (%s); using the jinja2 environment" % e, file=sys.stderr)
    if render is None:
        render, how = jinja_renderer()
    import jinja2

    convs = json.load(open(os.path.join(DATA, "conversations.json"), encoding="utf-8"))
    specials = json.load(open(os.path.join(DATA, "special_tokens.json"), encoding="utf-8"))
    os.makedirs(args.out, exist_ok=True)
    tdir = os.path.join(DATA, "templates")
    count = 0
    for fname in sorted(os.listdir(tdir)):
        if not fname.endswith(".jinja"):
            continue
        name = fname[: -len(".jinja")]
        with open(os.path.join(tdir, fname), encoding="utf-8", newline="") as f:
            template = f.read()
        for conv in convs:
            try:
                text = render(template, conv, specials[name])
            except jinja2.exceptions.TemplateError as e:
                if type(e) is jinja2.exceptions.TemplateError:  # raise_exception, not a Jinja bug
                    text = "ERROR: %s" % e.message
                else:
                    text = "EXCEPTION: %s: %s" % (type(e).__name__, e)
            except Exception as e:  # noqa: BLE001 - any failure is a golden too
                text = "EXCEPTION: %s: %s" % (type(e).__name__, e)
            with open(os.path.join(args.out, "%s__%s.txt" % (name, conv["name"])), "w",
                      encoding="utf-8", newline="") as f:
                f.write(text)
            count += 1
    with open(os.path.join(args.out, "RENDERER"), "w") as f:
        f.write(how + "\n")
    print("wrote %d goldens with %s" % (count, how))


if __name__ == "__main__":
    main()
