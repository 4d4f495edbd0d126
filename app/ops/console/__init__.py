"""Operator console home page and human review workbench, served by the ops worker."""
