"""The HTTP side: exposition bytes, the server and its limits, routes, the page, web-config."""
