"""Paper-style reports from (score, error) tables: the FDR/coverage tables (Markdown, LaTeX), figures,
baselines, the split-ratio and sensitivity studies, and the Monte-Carlo validity study.
"""
