"""Webhooks: endpoints per tenant and signed deliveries of background responses' ends.

- `endpoints`: the ``/v1/webhook_endpoints`` operations (``client.webhooks``), the
  operator's endpoint (``--webhook``);
- `post`: one delivery attempt, behind the host policy;
- `sender`: the task that claims, posts, retries and settles the outbox's deliveries.

The outbox itself is state (``store/webhooks.py``): written by the response store
with a background response's final state.
"""
