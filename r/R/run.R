#' Seal a plan: bind yourself to the whole sequence
#'
#' The server first checks what the plan's analyses alone doom (a DP request past your budget,
#' a kind the dataset refuses); then the client validates every analysis against the metadata,
#' hash-chains them and signs the header with your key. A sealed mistake cannot be undone.
#' @param session A `sa_session`.
#' @param plan A `sa_plan`.
#' @param declare_kinds List the plan's analysis kinds in the signed header (for a centre that
#'   requires a certification authority's claims, docs/ca.md).
#' @return A `sa_sealed`.
#' @export
sa_seal <- function(session, plan, declare_kinds = FALSE) {
  py <- pcall(session$py$seal, plan$py, declare_kinds = declare_kinds)
  sealed_object(py)
}

sealed_object <- function(py) {
  fields <- py$header_fields
  structure(
    list(
      py = py,
      dataset = reticulate::py_to_r(fields$dataset),
      researcher = reticulate::py_to_r(fields$researcher),
      server = reticulate::py_to_r(fields$server),
      steps = reticulate::py_to_r(py$steps)
    ),
    class = "sa_sealed"
  )
}

#' @export
print.sa_sealed <- function(x, ...) {
  cat(sprintf("<safeaccess sealed sequence: %d analyses on %s by %s for %s>\n",
              x$steps, x$dataset, x$researcher, x$server))
  invisible(x)
}

#' Write a sealed sequence to a file, or read it back
#'
#' Keep the file: it holds every step, and `sa_run` (or `safeaccess run`) takes it again to
#' resume the sequence.
#' @param sealed A `sa_sealed`.
#' @param path The file.
#' @export
sa_write_sealed <- function(sealed, path) {
  text <- rcall(sealed$py$to_json)
  writeLines(text, path, sep = "")
  invisible(path)
}

#' @rdname sa_write_sealed
#' @export
sa_read_sealed <- function(path) {
  cls <- sa_py("safeaccess.client.protocol.sealed")$SealedSequence
  text <- paste(readLines(path, warn = FALSE), collapse = "\n")
  sealed_object(pcall(cls$from_json, text))
}

# A sealed sequence from a `sa_sealed`, its file, or a results folder holding `sealed.json`.
as_sealed <- function(x) {
  if (inherits(x, "sa_sealed")) {
    return(x)
  }
  if (is.character(x) && length(x) == 1) {
    path <- path.expand(x)
    if (dir.exists(path)) path <- file.path(path, "sealed.json")
    if (file.exists(path)) return(sa_read_sealed(path))
  }
  stop("give a sealed sequence (sa_seal), its file, or a results folder with sealed.json",
       call. = FALSE)
}

#' Run a sealed sequence
#'
#' Opens the sequence (or resumes it, if it was opened before), then for each step waits for the
#' decision and reveals the next only after a release; stops after a withhold or a failure, or
#' at a step still in review after `review_timeout` seconds. Each receipt is checked against
#' the sealed sequence and the output received (by the Python client).
#' @param session A `sa_session`.
#' @param sealed A `sa_sealed`, or the path of a sealed file.
#' @param review_timeout Seconds to wait for an output checker at a step in review.
#' @param poll_interval Seconds between polls while waiting.
#' @param progress TRUE to print a line per step as it goes.
#' @param on_step An R function called with each step's `sa_step` as soon as it is decided.
#' @return A `sa_results`: a list of `sa_step`, one per revealed step.
#' @export
sa_run <- function(session, sealed, review_timeout = 0, poll_interval = 2, progress = FALSE,
                   on_step = NULL) {
  sealed <- as_sealed(sealed)
  callback <- if (is.null(on_step)) NULL else function(result) {
    on_step(step_object(result))
    NULL
  }
  say <- if (isTRUE(progress)) function(line) {
    cat(as_r(line), "\n", sep = "")
    NULL
  } else FALSE
  py <- pcall(session$py$run, sealed$py, review_timeout = as.numeric(review_timeout),
              poll_interval = as.numeric(poll_interval), on_step = callback, progress = say)
  results_object(py, sealed)
}

#' Resume a sequence
#'
#' With the sealed sequence (a `sa_sealed`, its file, or a results folder holding
#' `sealed.json`), this is [sa_run()] on it: the client finds the opened sequence on the server
#' and continues it, never opening it twice, returning the earlier steps too. With a sequence id
#' it calls the Python client's `session.resume(sequence_id)`, which reads the sealed sequence
#' from the local journal of sequences this user ran (`docs/researcher.md`).
#' @param session A `sa_session`.
#' @param sequence A sealed sequence, its file or results folder, or a sequence id.
#' @param ... Passed to [sa_run()] or `session.resume`.
#' @return A `sa_results`.
#' @export
sa_resume <- function(session, sequence, ...) {
  is_id <- is.character(sequence) && length(sequence) == 1 &&
    !file.exists(path.expand(sequence))
  if (!is_id) {
    return(sa_run(session, sequence, ...))
  }
  py <- pcall(session$py$resume, sequence, ...)
  results_object(py, NULL)
}

results_object <- function(py, sealed) {
  steps <- lapply(seq_len(reticulate::py_len(py)) - 1L, function(i) {
    step_object(reticulate::py_get_item(py, i))
  })
  structure(steps, class = "sa_results", py = py, sealed = sealed)
}

step_object <- function(py) {
  fields <- reticulate::py_to_r(sa_py("bridge")$step_fields(py))
  reasons <- fields$reasons
  fields$reasons <- data.frame(
    check = vapply(reasons, `[[`, "", "check"),
    verdict = vapply(reasons, `[[`, "", "verdict"),
    item = vapply(reasons, function(r) if (is.null(r$item)) NA_character_ else r$item, ""),
    message = vapply(reasons, `[[`, "", "message"),
    stringsAsFactors = FALSE
  )
  fields$released <- identical(fields$status, "released")
  fields$py <- py
  structure(fields, class = "sa_step")
}

#' @export
print.sa_step <- function(x, ...) {
  cat(x$description, "\n", sep = "")
  if (x$released) {
    frame <- as.data.frame(x)
    if (!is.null(frame)) print(frame)
  }
  invisible(x)
}

#' @export
print.sa_results <- function(x, ...) {
  for (step in x) {
    cat(step$description, "\n", sep = "")
  }
  invisible(x)
}

#' @export
`[.sa_results` <- function(x, i) {
  structure(unclass(x)[i], class = "sa_results", py = attr(x, "py"), sealed = attr(x, "sealed"))
}

#' @export
as.data.frame.sa_results <- function(x, ...) {
  data.frame(
    index = vapply(x, `[[`, 0L, "index"),
    kind = vapply(x, function(s) if (is.null(s$kind)) NA_character_ else s$kind, ""),
    status = vapply(x, `[[`, "", "status"),
    stringsAsFactors = FALSE
  )
}

#' A released output as a data.frame
#'
#' The same columns as `frame()` in Python: a table's cells by its column labels, a
#' regression's coefficients, a test's one row, a summary's rows per group and variable, a
#' survival table's steps, DP estimates and standard errors. Where Python's frame has a named
#' index (a table's row variables, a regression's `term`, a model's `metric`, DP groups) it
#' becomes the leading columns; an unnamed one (a correlation's variables) becomes the row
#' names. Counts are integers, suppressed cells NA. A regression's n and fit (Python's
#' `frame.attrs`) are in `attr(frame, "attrs")`.
#' @param x A `sa_step`.
#' @param ... Unused.
#' @return A data.frame, or NULL when nothing was released.
#' @export
as.data.frame.sa_step <- function(x, ...) {
  data <- rcall(sa_py("bridge")$frame_columns, x$py)
  if (is.null(data)) {
    return(NULL)
  }
  columns <- Map(function(values, kind) {
    na <- switch(kind, integer = NA_integer_, double = NA_real_, logical = NA, NA_character_)
    values <- lapply(values, function(v) if (is.null(v)) na else v)
    switch(kind,
      integer = as.integer(unlist(values)),
      double = as.numeric(unlist(values)),
      logical = as.logical(unlist(values)),
      as.character(unlist(values))
    )
  }, data$columns, data$kinds)
  frame <- as.data.frame(stats::setNames(columns, data$names), stringsAsFactors = FALSE,
                         check.names = FALSE, optional = TRUE)
  if (!length(columns)) frame <- data.frame()
  if (!is.null(data$row_names)) row.names(frame) <- unlist(data$row_names)
  if (length(data$attrs)) attr(frame, "attrs") <- data$attrs
  frame
}

#' @rdname as.data.frame.sa_step
#' @export
sa_frame <- function(x) {
  as.data.frame.sa_step(x)
}

#' Save the results folder
#'
#' Writes what `results.save(dir)` writes in Python: `sealed.json`, `summary.json`,
#' `README.md`, each released output as JSON and CSV under `steps/`, and each final step's
#' receipt under `receipts/`. A folder holding another sequence's results is refused.
#' @param results A `sa_results` from [sa_run()].
#' @param directory The folder.
#' @return The folder's path, invisibly.
#' @export
sa_save <- function(results, directory) {
  py <- attr(results, "py")
  if (is.null(py) || !reticulate::py_has_attr(py, "save")) {
    stop("only the results of sa_run() can be saved", call. = FALSE)
  }
  path <- pcall(py$save, path.expand(directory))
  invisible(reticulate::py_str(path))
}
