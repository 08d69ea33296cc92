"""The project's own checks: its layout, its docs and its public face."""

# The modules whose names are the public API (each has its page in docs/reference).
PUBLIC_MODULES = (
    "imggw_client",
    "imggw_client.tracking",
    "imggw_client.batch",
    "imggw_client.mock",
    "imggw_client.rules",
    "imggw_client.text",
)
