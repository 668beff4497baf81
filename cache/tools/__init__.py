"""The `mtcache` command line (`cli`), `mtcache demo` (`demo`) and the bookstore it loads
(`bookstore`)."""
