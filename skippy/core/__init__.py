"""The ground layer every other imports: settings and their declarations, the error classes, the
one gate every subprocess goes through, git, files written whole, and console output.

It imports no other layer.
"""
