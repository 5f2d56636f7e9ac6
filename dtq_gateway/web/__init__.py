"""The web dashboard: the HTTP server, its JSON API over the store and the static page.
"""
