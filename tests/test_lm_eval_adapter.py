"""lm_eval_adapter.py: loglikelihood of (context, continuation) pairs and rolling loglikelihood against a direct
computation with the model's forward pass (no lm_eval needed); with lm_eval installed, its wrapper, and lm_eval's own
hf model on the export_hf.py folder of the same checkpoint as a second reference."""
import base64
import json
import math

import numpy as np
import pytest
import tiktoken
import torch
import torch.nn.functional as F

import analyze
import lm_eval_adapter as adapter
import prepare_c4
from harness import dataset, runs, tokenizer as tokenizer_lib
from model import GPT, GPTConfig

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('one_thread')]   # slow: the harness scoring through transformers
MERGES = (b'th', b'the', b' the', b'in', b'ing', b' in', b'er', b'en', b' a', b'at', b' m', b' mat')
T = 16   # block size: the texts below are longer


@pytest.fixture(scope='module')
def vocab(tmp_path_factory):
    ranks = {bytes([b]): b for b in range(256)}
    for m in MERGES:
        ranks[m] = len(ranks)
    path = tmp_path_factory.mktemp('vocab') / 'tiny.tiktoken'
    path.write_bytes(b''.join(base64.b64encode(t) + b' ' + str(r).encode() + b'\n' for t, r in ranks.items()))
    enc = tiktoken.Encoding('tiny', pat_str=tokenizer_lib.GPT2_PAT, mergeable_ranks=ranks,
                            special_tokens={'<|endoftext|>': len(ranks)})
    return str(path), enc


def checkpoint(tmp_path, vocab, bos=None, **kw):
    """A tiny random GPT-2-style checkpoint recording the tiny tokenizer; (LoadedModel, Tokenizer)."""
    torch.manual_seed(0)
    record = tokenizer_lib.load_tokenizer(vocab[0]).record()
    cfg = GPTConfig(**dict(n_layer=2, n_head=2, n_embd=32, block_size=T, vocab_size=record['vocab_size']) | kw)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    path = tmp_path / 'ckpt.pt'
    torch.save({'model': model.state_dict(), 'model_args': cfg.__dict__.copy(), 'iter_num': 0, 'config': {},
                'tokenizer': record, 'bos': bos}, path)
    return runs.load_model(str(path)), tokenizer_lib.load_tokenizer(vocab[0])


@torch.no_grad()
def direct(model, context, continuation):
    """log p(continuation | context) and greedy, from one forward pass over the last T + 1 tokens."""
    seq = (context + continuation)[-(T + 1):]
    logp = F.log_softmax(model(torch.tensor([seq[:-1]]))[0][0].float(), -1)
    rows = logp[len(seq) - 1 - len(continuation):]
    target = torch.tensor(continuation)
    return float(rows.gather(1, target[:, None]).sum()), bool((rows.argmax(-1) == target).all())


@torch.no_grad()
def direct_rolling(model, tokens, prefix):
    """Each token i scored by its own forward pass over the at most T tokens before the end of its block of T
    predictions (the prefix token first): the definition of lm_eval's rolling windows, token by token."""
    seq, total = [prefix] + list(tokens), 0.0
    for i in range(len(tokens)):
        end = min((i // T + 1) * T, len(tokens))
        start = max(0, end - T)
        logp = F.log_softmax(model(torch.tensor([seq[start:end]]))[0][0].float(), -1)
        total += float(logp[i - start, tokens[i]])
    return total


PAIRS = [("the cat sat on", " the mat"), ("the cat sat on ", "the mat"), ("", "thing in the evening"),
         ("a long context: " + "the thing in the evening is interesting, " * 3, " the end"), ("th", "ing"),
         ("Numbers 12", " 34!")]


@pytest.mark.parametrize('bos', [None, 268])
def test_loglikelihood_equals_a_direct_forward_pass(tmp_path, vocab, bos):
    lm, tok = checkpoint(tmp_path, vocab, bos=bos)
    enc, eot = vocab[1], tok.eot_token
    got = adapter.loglikelihood(lm, tok, PAIRS, batch_size=3)
    one_by_one = adapter.loglikelihood(lm, tok, PAIRS, batch_size=1)       # padding changes nothing
    assert np.allclose([x for x, _ in one_by_one], [x for x, _ in got], atol=1e-5)
    assert [g for _, g in one_by_one] == [g for _, g in got]
    for (context, continuation), (logp, greedy) in zip(PAIRS, got):
        if context:   # lm_eval's split: trailing spaces move; the continuation = what follows the context's tokens
            ctx = enc.encode_ordinary(context.rstrip())
            cont = enc.encode_ordinary(context + continuation)[len(ctx):]
            ctx = ([bos] if bos is not None else []) + ctx
        else:
            ctx, cont = [bos if bos is not None else eot], enc.encode_ordinary(continuation)
        want = direct(lm.model, ctx, cont)
        assert logp == pytest.approx(want[0], abs=1e-4) and greedy == want[1]
    assert got[0] == got[1]                                   # the trailing space moved to the continuation
    assert len(enc.encode_ordinary(PAIRS[3][0])) > T          # truncated on the left to T + 1 tokens
    # greedy is True exactly when every continuation token is the argmax
    ctx = enc.encode_ordinary("the cat sat on")
    best = int(lm.model(torch.tensor([ctx]))[0][0, -1].argmax())
    assert adapter.score(lm, [(ctx, [best]), (ctx, [(best + 1) % 200])])[0][1] is True
    assert adapter.score(lm, [(ctx, [(best + 1) % 200])])[0][1] is False


def test_a_free_prefix_shows_no_continuation_token_to_its_predictor(tmp_path, vocab):
    """causal_free_prefix = 6: positions 0-4 of a full pass see the tokens after them. Each continuation token must be
    scored from the tokens before it only: the reference is one forward pass over exactly those tokens per token."""
    lm, _ = checkpoint(tmp_path, vocab, causal_free_prefix=6)
    seq = torch.randint(0, 200, (2 * T,), generator=torch.Generator().manual_seed(0)).tolist()
    requests = [(seq[:1], seq[1:9]), (seq[:3], seq[3:5]), (seq[:12], seq[12:15]), (seq[:T + 4], seq[T + 4:T + 8])]
    requests += adapter.rolling_windows(seq[:40], 268, T)     # the last window has a context of 8, its first 1
    assert min(len(c) for c, _ in requests) == 1

    @torch.no_grad()
    def reference(context, continuation):
        s, total, greedy = (context + continuation)[-(T + 1):], 0.0, True
        for j in range(len(s) - len(continuation), len(s)):
            logp = F.log_softmax(lm.model(torch.tensor([s[:j]]))[0][0, -1].float(), -1)
            total, greedy = total + float(logp[s[j]]), greedy and int(logp.argmax()) == s[j]
        return total, greedy
    got = adapter.score(lm, requests, batch_size=4)
    for request, (logp, greedy) in zip(requests, got):
        want = reference(*request)
        assert logp == pytest.approx(want[0], abs=1e-4) and greedy == want[1]
    with torch.no_grad():                                      # the full pass alone would have seen the answers
        assert abs(direct(lm.model, *requests[0])[0] - reference(*requests[0])[0]) > 0.1


def test_rolling_windows_predict_every_token_once_with_full_contexts():
    tokens = list(range(100, 137))                            # 37 tokens, T = 16
    windows = adapter.rolling_windows(tokens, 7, T)
    assert [t for _, cont in windows for t in cont] == tokens
    assert windows[0] == ([7], tokens[:T])
    for ctx, cont in windows[1:]:
        assert len(ctx) + len(cont) == T + 1 and ctx + cont == tokens[tokens.index(ctx[0]):tokens.index(cont[-1]) + 1]
    assert adapter.rolling_windows([], 7, T) == [] and adapter.rolling_windows([5], 7, T) == [([7], [5])]


@pytest.mark.parametrize('bos', [None, 268])
def test_rolling_loglikelihood_equals_a_token_by_token_computation(tmp_path, vocab, bos):
    lm, tok = checkpoint(tmp_path, vocab, bos=bos)
    texts = ["the thing in the evening is interesting; " * 4, "short", "", "naïve café 12 the mat"]
    got = adapter.loglikelihood_rolling(lm, tok, texts, batch_size=4)
    prefix = bos if bos is not None else tok.eot_token
    for text, value in zip(texts, got):
        tokens = vocab[1].encode_ordinary(text)
        assert value == pytest.approx(direct_rolling(lm.model, tokens, prefix), abs=1e-4)
    assert len(vocab[1].encode_ordinary(texts[0])) > 2 * T and got[2] == 0.0


def test_rolling_perplexity_of_a_prepared_folder(tmp_path, vocab, capsys):
    lm, tok = checkpoint(tmp_path, vocab)
    texts = ["the thing in the evening is interesting. " * 3, "a mat", "x", "", "then the mat, then the end"]
    out = tmp_path / 'data'
    dataset.prepare(out, tok, {'test': 1}, 'test texts', '', True, lambda split: texts,
                       {'train': (None, None), 'val': (None, None)})
    nll = count = 0
    for text in texts:
        tokens = vocab[1].encode_ordinary(text)
        nll -= direct_rolling(lm.model, tokens, tok.eot_token)
        count += len(tokens)
    result = adapter.data_perplexity(lm, str(out), batch_size=2, chunk_docs=2)
    assert (result['documents'], result['predicted_tokens']) == (len(texts), count)
    assert result['ppl'] == pytest.approx(math.exp(nll / count), rel=1e-5)
    adapter.main(['--ckpt', str(tmp_path / 'ckpt.pt'), '--data', str(out), '--json', str(tmp_path / 'r' / 'x.json')])
    saved = json.loads((tmp_path / 'r' / 'x.json').read_text())
    assert saved['ppl'] == pytest.approx(result['ppl']) and 'whole documents in windows of 16' in capsys.readouterr().out


def test_the_progress_line_counts_every_document(tmp_path, vocab, capsys):
    """Silent-wrong, case 16: the last progress line said "done, 0/3 docs" while the perplexity covered all 3 (the
    last chunk, shorter than chunk_docs, was not counted)."""
    lm, tok = checkpoint(tmp_path, vocab)
    out = tmp_path / 'data'
    dataset.prepare(out, tok, {'test': 1}, 'test texts', '', True, lambda split: ["the mat", "a thing", "then"],
                    {'train': (None, None), 'val': (None, None)})
    capsys.readouterr()
    for chunk_docs in (64, 2):
        assert adapter.data_perplexity(lm, str(out), chunk_docs=chunk_docs)['documents'] == 3
        done = [line for line in capsys.readouterr().err.splitlines() if 'rolling ppl: done' in line]
        assert len(done) == 1 and 'done, 3/3 docs' in done[0], done


def test_cli_errors_are_one_line(tmp_path, vocab, monkeypatch):
    checkpoint(tmp_path, vocab)
    monkeypatch.setitem(__import__('sys').modules, 'lm_eval', None)
    with pytest.raises(SystemExit) as e:
        adapter.main(['--ckpt', str(tmp_path / 'ckpt.pt'), '--tasks', 'hellaswag'])
    assert 'pip install lm_eval' in str(e.value.code) and '\n' not in str(e.value.code)
    with pytest.raises(SystemExit) as e:
        adapter.main(['--ckpt', str(tmp_path / 'ckpt.pt'), '--data', str(tmp_path / 'nothing')])
    assert 'not a prepared dataset' in str(e.value.code)
    # a local path that is not a checkpoint is answered as one (it was the Hugging Face download hint)
    (tmp_path / 'only_best').mkdir()
    (tmp_path / 'only_best' / 'best.pt').write_bytes((tmp_path / 'ckpt.pt').read_bytes())
    for ckpt, named in ((tmp_path / 'nope', 'nope: not found'),
                        (tmp_path / 'only_best', 'the folder holds no ckpt.pt')):
        with pytest.raises(SystemExit) as e:
            adapter.main(['--ckpt', str(ckpt), '--data', str(tmp_path / 'nothing')])
        assert named in str(e.value.code) and 'Hugging Face' not in str(e.value.code) and '\n' not in str(e.value.code)
    # a tokenizer that no longer gives the ids the checkpoint recorded (an edited .tiktoken file) is refused
    ckpt = torch.load(tmp_path / 'ckpt.pt', weights_only=False)
    ckpt['tokenizer'] = dict(ckpt['tokenizer'], probe=ckpt['tokenizer']['probe'][::-1])
    torch.save(ckpt, tmp_path / 'ckpt.pt')
    monkeypatch.setitem(__import__('sys').modules, 'lm_eval', __import__('types').ModuleType('lm_eval'))
    with pytest.raises(SystemExit) as e:
        adapter.main(['--ckpt', str(tmp_path / 'ckpt.pt'), '--tasks', 'hellaswag'])
    assert 'is not the tokenizer its data was prepared with' in str(e.value.code) and '\n' not in str(e.value.code)


@pytest.mark.parametrize('argv, named', [
    (['--data', '{data}', '--limit', '5'], "--limit is lm_eval's (with --tasks)"),           # issue 36, case 8
    (['--data', '{data}', '--include_path', '{tmp}'], "--include_path is lm_eval's (with --tasks)"),
    (['--data', '{data}', '--num_fewshot', '0'], "--num_fewshot is lm_eval's (with --tasks)"),
    (['--tasks', 'hellaswag', '--num_fewshot', '-1'], 'argument --num_fewshot: -1 is not allowed'),   # case 9
    (['--tasks', 'hellaswag', '--limit', 'nan'], 'argument --limit: nan is not allowed'),
    (['--tasks', 'hellaswag', '--limit', '0'], 'argument --limit: 0 is not allowed'),
    (['--tasks', 'hellaswag', '--limit', '2.5'], '--limit 2.5: a fraction below 1, or a whole number'),
    (['--tasks', 'hellaswag', '--max_docs', '3'], "--max_docs is --data's"),
    (['--tasks', 'hellaswag', '--include_path', '{tmp}/none'], 'none: no such folder'),
    (['--data', '{data}', '--json', '{tmp}/ckpt.pt'], 'is the input'),                        # the checkpoint itself
    (['--data', '{data}', '--json', '{tmp}/ckpt.pt/x.json'], 'ckpt.pt is a file, not a folder'),
])
def test_arguments_that_would_be_ignored_or_are_out_of_range_are_refused(tmp_path, vocab, monkeypatch, capsys,
                                                                        argv, named):
    """An option another mode reads, or a number out of range, is refused before any model loads, never ignored."""
    checkpoint(tmp_path, vocab)
    monkeypatch.setitem(__import__('sys').modules, 'lm_eval', __import__('types').ModuleType('lm_eval'))
    monkeypatch.setattr(adapter.runs, 'load_model', lambda *a: pytest.fail('loaded a model for a refused command'))
    before = (tmp_path / 'ckpt.pt').read_bytes()
    with pytest.raises(SystemExit) as e:
        adapter.main(['--ckpt', str(tmp_path / 'ckpt.pt')] + [a.format(data=tmp_path / 'data', tmp=tmp_path)
                                                              for a in argv])
    said = str(e.value.code) if e.value.code != 2 else capsys.readouterr().err
    assert named in said and 'Traceback' not in said, said
    assert (tmp_path / 'ckpt.pt').read_bytes() == before


# ----------------------------------------------------------------------------- with lm_eval installed
def test_harness_wrapper_and_lm_evals_own_hf_model_agree(tmp_path, vocab):
    pytest.importorskip('lm_eval', reason='optional: pip install lm_eval')
    pytest.importorskip('transformers')
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    import export_hf
    lm, tok = checkpoint(tmp_path, vocab)
    wrapped = adapter.harness_model(lm, tok, batch_size=2)
    pairs = [p for p in PAIRS if p[0]]
    texts = ["the thing in the evening is interesting; " * 4, "short", "naïve café 12 the mat"]
    requests = [Instance('loglikelihood', {}, p, i) for i, p in enumerate(pairs)]
    rolling = [Instance('loglikelihood_rolling', {}, (t,), i) for i, t in enumerate(texts)]
    ours = wrapped.loglikelihood(requests), wrapped.loglikelihood_rolling(rolling)
    assert ours == (adapter.loglikelihood(lm, tok, pairs), adapter.loglikelihood_rolling(lm, tok, texts))
    with pytest.raises(NotImplementedError):
        wrapped.generate_until([])
    export_hf.main(['--ckpt', str(tmp_path / 'ckpt.pt'), '--out', str(tmp_path / 'hf')])
    hf = HFLM(pretrained=str(tmp_path / 'hf'), device='cpu', batch_size=1)
    theirs = hf.loglikelihood(requests, disable_tqdm=True), hf.loglikelihood_rolling(rolling, disable_tqdm=True)
    assert hf.max_length == T and hf.prefix_token_id == tok.eot_token
    assert np.allclose([x for x, _ in ours[0]], [x for x, _ in theirs[0]], atol=1e-4)
    assert [g for _, g in ours[0]] == [g for _, g in theirs[0]]
    assert np.allclose(ours[1], theirs[1], atol=1e-4)


def test_cli_runs_a_local_lm_eval_task(tmp_path, vocab, capsys):
    """--tasks through lm_eval.simple_evaluate on a multiple-choice task of our own (--include_path, local JSON):
    its accuracy is that of the choice our loglikelihood ranks first (lm_eval joins question and choice with ' ')."""
    pytest.importorskip('lm_eval', reason='optional: pip install lm_eval')
    lm, tok = checkpoint(tmp_path, vocab)
    docs = [{'question': 'the cat sat on', 'choices': ['the mat', 'a thing', 'in'], 'answer': 0},
            {'question': 'in the evening', 'choices': ['the', 'ing', 'mat'], 'answer': 2},
            {'question': 'Numbers 12', 'choices': ['34', 'the end'], 'answer': 1}]
    tasks = tmp_path / 'tasks'
    tasks.mkdir()
    (tasks / 'docs.jsonl').write_text(''.join(json.dumps(d) + '\n' for d in docs))
    (tasks / 'tiny_choice.yaml').write_text(
        f"task: tiny_choice\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tasks / 'docs.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n"
        "doc_to_choice: '{{choices}}'\nmetric_list:\n  - metric: acc\n")
    adapter.main(['--ckpt', str(tmp_path / 'ckpt.pt'), '--tasks', 'tiny_choice', '--include_path', str(tasks),
                  '--json', str(tmp_path / 'r.json')])
    acc = json.loads((tmp_path / 'r.json').read_text())['results']['tiny_choice']['acc,none']
    scores = [[x for x, _ in adapter.loglikelihood(lm, tok, [(d['question'], ' ' + c) for c in d['choices']])]
              for d in docs]
    assert acc == pytest.approx(np.mean([int(np.argmax(s)) == d['answer'] for s, d in zip(scores, docs)]))
