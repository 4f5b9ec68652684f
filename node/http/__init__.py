"""The node's HTTP surface: the aiohttp application and its error edge (``app``, ``api``),
request parsing (``params``), connection limits (``limits``), the point-write coalescer and
fast encoder, and the route sets nodes and the Spark bridge call (``routes/``)."""
