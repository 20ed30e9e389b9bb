"""Annotation: comparison tasks to annotate, importers of annotation-tool exports, pair formation."""
