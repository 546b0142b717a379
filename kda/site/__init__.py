"""The site's build plumbing: snippets (run, cache, GPU records), MkDocs hooks, the CLI."""
