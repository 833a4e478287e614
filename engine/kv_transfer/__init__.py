"""Prefill/decode disaggregation: KV blocks handed from one engine to another (vLLM v1's KV connector).

``base.py`` is the interface, split by role as vLLM's ``KVConnectorBase_V1``: a scheduler side that only
decides and a worker side that only moves bytes; ``lease.py`` the prefill side's leases (vLLM's pull
order); ``bootstrap.py`` the prefill side's bootstrap rooms (SGLang's push order, ``KVPoll``); and
``shared_memory_connector.py`` a transport over shared memory in either order, through the prefill
instance's HTTP side channel. ``docs/disaggregation.md`` tells the whole story.
"""
