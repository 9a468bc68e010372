"""Draft-head training (issue 8): attention masks, data generation, recipes (DART, JetSpec).

No vLLM imports outside data generation, which drives the target through vLLM.
"""
