# The Python side: the client's modules, imported once on first use, and the conversion of
# Python exceptions into R conditions.

.sa <- new.env(parent = emptyenv())

# The client's modules (and the package's glue module), imported on first use so that
# library(safeaccess) works before reticulate has chosen a Python.
sa_py <- function(module) {
  if (is.null(.sa$modules)) {
    .sa$modules <- list()
  }
  if (is.null(.sa$modules[[module]])) {
    .sa$modules[[module]] <- if (identical(module, "bridge")) {
      reticulate::import_from_path(
        "safeaccess_r", system.file("python", package = "safeaccess"), convert = FALSE
      )
    } else {
      reticulate::import(module, convert = FALSE)
    }
  }
  .sa$modules[[module]]
}

# A Python exception as an R condition: the message exactly as Python words it (a plan-time
# refusal keeps every line), never the traceback; classes from the exception's own classes
# (`safeaccess_AnalysisInvalid`, `safeaccess_ServerError`, ...), then `safeaccess_error`.
sa_condition <- function(exc, call = NULL) {
  info <- reticulate::py_to_r(sa_py("bridge")$error_fields(exc))
  .sa$last_exception <- exc
  problems <- info$problems
  problems <- if (length(problems)) {
    data.frame(
      field = vapply(problems, `[[`, "", "field"),
      message = vapply(problems, `[[`, "", "message"),
      stringsAsFactors = FALSE
    )
  } else {
    NULL
  }
  structure(
    class = c(paste0("safeaccess_", unlist(info$classes)), "safeaccess_error", "error", "condition"),
    list(
      message = info$message,
      call = call,
      python_class = info$python_class,
      code = info$code,
      status = info$status,
      problems = problems
    )
  )
}

# Call a Python function (`fn`, e.g. `session$plan`) with R arguments; its value stays a Python
# object. An exception it raises becomes an R condition of class `safeaccess_error` carrying the
# Python message (see sa_condition), and no call: the message is the client's whole account.
pcall <- function(fn, ..., .call = NULL) {
  outcome <- sa_py("bridge")$call(fn, ...)
  if (!reticulate::py_to_r(outcome$ok)) {
    stop(sa_condition(outcome$error, .call))
  }
  outcome$value
}

# pcall, with the value converted to R.
rcall <- function(fn, ..., .call = NULL) {
  reticulate::py_to_r(pcall(fn, ..., .call = .call))
}

#' The Python traceback of the last error the client raised
#'
#' Conditions from the client carry Python's message only; this returns the traceback behind
#' the last one, for a bug report.
#' @return A character string (invisibly also printed), or NULL when no error was raised.
#' @export
sa_last_traceback <- function() {
  if (is.null(.sa$last_exception)) {
    return(NULL)
  }
  text <- reticulate::py_to_r(sa_py("bridge")$last_traceback(.sa$last_exception))
  cat(text)
  invisible(text)
}

# A Python None / R NULL argument, and a path argument as an expanded string.
opt_path <- function(path) {
  if (is.null(path)) NULL else path.expand(as.character(path))
}

# A callback's argument as an R value (reticulate passes them unconverted from a module
# imported with convert = FALSE).
as_r <- function(x) {
  if (inherits(x, "python.builtin.object")) reticulate::py_to_r(x) else x
}
