"""Safe file I/O every stage uses: limits on what a file may cost, reading arrays and telling
what a file is, writing outputs atomically, and checking JSON documents against a schema."""
