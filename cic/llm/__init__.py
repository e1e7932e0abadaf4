"""Answers and their uncertainty (torch, transformers, sentence-transformers, imported lazily): model loading,
the decode loop, sentence embeddings, semantic equivalence, the uncertainty estimators and alignment criteria.
"""
