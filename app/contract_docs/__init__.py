"""Published event contracts: JSON Schemas, the AsyncAPI document, and the compatibility gate.

Generated from the pydantic models (``schemas/``) and the topic plan (``app.platform.topics``,
``app.platform.flows``); regenerate with ``python -m app.contract_docs``.
"""
