"""The JSON API: the application, the auditors' endpoints, the embedded server.

Named `http` inside `safeaccess.server`; the standard library's `http` is still what
`import http` gives (imports are absolute), so nothing here may import it relatively.
"""
