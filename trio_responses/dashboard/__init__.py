"""The operator page's static files (``index.html``, ``dashboard.js``, ``dashboard.css``).

Served by `trio_responses.api.dashboard` when the server runs with ``--dashboard``;
plain files, no build step, nothing fetched from elsewhere.
"""
