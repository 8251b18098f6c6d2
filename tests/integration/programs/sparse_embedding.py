"""Sparse gradients: a TensorFlow 1.x graph (through ``tf.compat.v1``) with a
word embedding, trained with ``hvd.DistributedOptimizer`` in a ``tf.Session``.

    tfhvdrun -np 2 python sparse_embedding.py

The corpus is made up here, the same on every rank: sentences that walk
through a fixed successor table over a vocabulary of ``--vocab`` words, so
each word has one next word.  The model embeds a word and predicts the word
after it with a sampled softmax.  ``embedding_lookup`` and the sampled softmax
both give ``tf.IndexedSlices`` gradients (a few rows of large tables), which
the distributed optimizer exchanges as slices, not as dense tables.  Each rank
draws its own random batches; after ``hvd.broadcast_global_variables(0)``
every rank holds rank 0's initial tables.  Every rank prints its average loss
each ``--report-every`` steps; rank 0 prints how often the full softmax names
the right next word and the nearest neighbours of a few words.
"""

import argparse
import zlib

import numpy as np
import tensorflow.compat.v1 as tf

import tfhvd.tensorflow as hvd
from _support import report_weights

tf.disable_v2_behavior()


def make_corpus(vocab, tokens, sentence, seed=2026):
    """``(corpus, successor)``: int32 word ids of ``tokens`` words in sentences
    of ``sentence`` words, each word followed by ``successor[word]``."""
    rng = np.random.default_rng(seed)
    successor = rng.permutation(vocab).astype(np.int32)
    corpus = np.empty(tokens, np.int32)
    for start in range(0, tokens, sentence):
        word = rng.integers(vocab)
        for k in range(start, min(start + sentence, tokens)):
            corpus[k] = word
            word = successor[word]
    return corpus, successor


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--report-every", type=int, default=250)
    parser.add_argument("--batch-size", type=int, default=128, help="largest batch per rank")
    parser.add_argument("--sampled", type=int, default=32, help="negative classes per batch")
    parser.add_argument("--lr", type=float, default=0.5, help="for one rank")
    args = parser.parse_args()

    hvd.init()
    sentence = 20
    corpus, successor = make_corpus(args.vocab, 200 * args.vocab, sentence)
    print("rank %d corpus: %d words, vocabulary %d, crc32 %08x" % (
        hvd.rank(), len(corpus), args.vocab, zlib.crc32(corpus.tobytes())), flush=True)
    # Positions with a next word in the same sentence.
    positions = np.flatnonzero(np.arange(len(corpus) - 1) % sentence != sentence - 1)

    words = tf.placeholder(tf.int32, [None], name="words")
    next_words = tf.placeholder(tf.int64, [None, 1], name="next_words")
    embeddings = tf.Variable(tf.random_uniform([args.vocab, args.dim], -1.0, 1.0), name="emb")
    out_weights = tf.Variable(tf.truncated_normal([args.vocab, args.dim],
                                                  stddev=args.dim ** -0.5), name="out_w")
    out_biases = tf.Variable(tf.zeros([args.vocab]), name="out_b")
    embedded = tf.nn.embedding_lookup(embeddings, words)
    loss = tf.reduce_mean(tf.nn.sampled_softmax_loss(
        weights=out_weights, biases=out_biases, labels=next_words, inputs=embedded,
        num_sampled=args.sampled, num_classes=args.vocab))
    logits = tf.matmul(embedded, out_weights, transpose_b=True) + out_biases
    hits = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), next_words[:, 0]), tf.float32))

    opt = hvd.DistributedOptimizer(tf.train.GradientDescentOptimizer(args.lr * hvd.size()))
    grads_and_vars = opt.compute_gradients(loss)
    if hvd.rank() == 0:
        print("gradient types: " + ", ".join("%s %s" % (v.op.name, type(g).__name__)
                                             for g, v in grads_and_vars), flush=True)
    train_op = opt.apply_gradients(grads_and_vars)

    unit = embeddings / tf.norm(embeddings, axis=1, keepdims=True)
    probe = tf.constant([0, 1, 2, 3], tf.int32)
    similarity = tf.matmul(tf.gather(unit, probe), unit, transpose_b=True)

    init = tf.global_variables_initializer()
    sync = hvd.broadcast_global_variables(0)
    rng = np.random.default_rng(100 + hvd.rank())
    with tf.Session() as session:
        session.run(init)
        session.run(sync)
        print("rank %d initialized from rank 0" % hvd.rank(), flush=True)
        total = 0.0
        for step in range(args.steps + 1):
            # Batches of varying size, as sentences of varying length give.
            pick = rng.choice(positions, rng.integers(args.batch_size // 2, args.batch_size + 1))
            _, value = session.run([train_op, loss], {words: corpus[pick],
                                                      next_words: corpus[pick + 1, None]})
            total += value
            if step % args.report_every == 0:
                average = total / (args.report_every if step else 1)
                print("rank %d average loss at step %d: %.4f" % (hvd.rank(), step, average),
                      flush=True)
                total = 0.0
        everyone = np.arange(args.vocab, dtype=np.int32)
        accuracy = session.run(hits, {words: everyone, next_words: successor[everyone, None]})
        if hvd.rank() == 0:
            print("next word right for %.1f%% of the vocabulary" % (100 * accuracy))
            for word, row in zip(session.run(probe), session.run(similarity)):
                print("nearest to w%d: %s" % (word, " ".join(
                    "w%d" % i for i in np.argsort(-row)[1:6])))
        report_weights(hvd.rank(), session.run([embeddings, out_weights, out_biases]))


if __name__ == "__main__":
    main()
