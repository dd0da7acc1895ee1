#' Start a local demo centre
#'
#' The embedded defaults of `safeaccess-server demo` (SQLite, the process sandbox) in a fresh
#' directory: the generated census and its DP twin `census-dp`, the demo project, a researcher
#' `ada` and an auditor `demo-auditor` with key files, served by `safeaccess-server serve` in a
#' child process on a free loopback port. For trying the package and for its tests; needs the
#' server distribution installed in reticulate's Python, and the processx package.
#'
#' @param rows Rows of the generated census.
#' @param dir The directory to create it in.
#' @param setup An optional Python file defining `setup(data_dir)`, called with the data
#'   directory (a `pathlib.Path`) after it is prepared and before the server starts (e.g. to
#'   register another dataset).
#' @param timeout Seconds to wait for the server to answer.
#' @return A `sa_demo_centre`: `url`, `key`, `researcher`, `auditor`, `auditor_key`, `data`;
#'   stop it with [sa_stop_centre()].
#' @export
sa_demo_centre <- function(rows = 2000, dir = tempfile("safeaccess-demo-"), setup = NULL,
                           timeout = 300) {
  if (!requireNamespace("processx", quietly = TRUE)) {
    stop("the demo centre needs the processx package (Debian: r-cran-processx)", call. = FALSE)
  }
  bridge <- sa_py("bridge")
  dir.create(dir, recursive = TRUE, showWarnings = FALSE)
  dir <- normalizePath(dir)
  port <- rcall(bridge$free_port)
  log <- file.path(dir, "server.log")
  # One child process prepares the data directory and serves it, so the server's modules are
  # imported once, and not into this R session's Python.
  process <- processx::process$new(
    reticulate::py_config()$python,
    c(system.file("python", "safeaccess_r.py", package = "safeaccess"), dir,
      as.character(as.integer(rows)), as.character(port),
      if (!is.null(setup)) normalizePath(setup)),
    stdout = log, stderr = "2>&1", cleanup = TRUE, env = python_env()
  )
  url <- sprintf("http://127.0.0.1:%d", port)
  # While the server starts, import the client here too (the two overlap on a busy machine).
  sa_py("safeaccess.client.session")
  sa_py("safeaccess.client.results")
  deadline <- Sys.time() + timeout
  up <- FALSE
  while (!up && process$is_alive() && Sys.time() < deadline) {
    up <- rcall(bridge$wait_until_up, url, 1)
  }
  if (!up) {
    process$kill()
    stop(sprintf("the demo centre did not start; its log:\n%s",
                 paste(readLines(log, warn = FALSE), collapse = "\n")), call. = FALSE)
  }
  centre <- jsonlite_free_read(file.path(dir, "centre.json"))
  centre$url <- url
  centre$process <- process
  centre$dir <- dir
  structure(centre, class = "sa_demo_centre")
}

# centre.json, read with the client's Python (no JSON package needed in R).
jsonlite_free_read <- function(path) {
  json <- reticulate::import("json", convert = TRUE)
  json$loads(paste(readLines(path, warn = FALSE), collapse = "\n"))
}

#' Stop a demo centre's server
#' @param centre A `sa_demo_centre`.
#' @export
sa_stop_centre <- function(centre) {
  if (centre$process$is_alive()) {
    centre$process$interrupt()
    if (!centre$process$wait(10000)$is_alive()) {
      return(invisible(TRUE))
    }
    centre$process$kill()
  }
  invisible(TRUE)
}

#' @export
print.sa_demo_centre <- function(x, ...) {
  cat(sprintf("<safeaccess demo centre at %s: researcher %s (key %s), auditor %s>\n",
              x$url, x$researcher, x$key, x$auditor))
  invisible(x)
}

# The environment for a Python child process. R puts its own library directory, the system's
# and Java's first on LD_LIBRARY_PATH, which makes a Python built elsewhere (pyenv, a venv of
# another build) load the system's libpython into its extension modules (`import ssl` fails).
# The child gets the path without them: the system's directories are searched anyway, after
# the interpreter's own run path.
python_env <- function() {
  paths <- strsplit(Sys.getenv("LD_LIBRARY_PATH"), ":", fixed = TRUE)[[1]]
  drop <- paths == "" | paths == R.home("lib") | grepl("^/(usr/)?lib(32|64)?(/|$)", paths) |
    grepl("/jvm/", paths, fixed = TRUE)
  c("current", LD_LIBRARY_PATH = paste(paths[!drop], collapse = ":"))
}
