#' Plot a released output with base R graphics
#'
#' Everything drawn is a released number, so a plot discloses nothing the output did not:
#' tables and histograms as bars over their categories or bins (grouped by column or `by`
#' group), survival tables as Kaplan-Meier step curves (one per group), regressions as
#' coefficients with 95 % intervals, DP answers as their noisy estimates with 95 % whiskers,
#' trained models as their ROC curve (else their test metrics). A step with nothing released
#' is an error.
#' @param x A `sa_step`.
#' @param ... Passed to the base graphics function drawing the main layer (`barplot`, `plot`).
#' @return The numbers drawn, invisibly: a matrix of bar heights for tables and histograms, a
#'   list of curves (`time`, `survival`) for survival, a data.frame of estimates and interval
#'   ends for regressions and DP answers.
#' @export
plot.sa_step <- function(x, ...) {
  out <- x$output
  if (is.null(out)) {
    stop(sprintf("step %d is %s: nothing was released to plot", x$index, x$status), call. = FALSE)
  }
  type <- out$type
  if (identical(type, "table")) return(invisible(plot_table(x, out, ...)))
  if (identical(type, "survival")) return(invisible(plot_survival(x, out, ...)))
  if (identical(type, "regression")) return(invisible(plot_regression(x, out, ...)))
  if (identical(type, "dp_answer") && !identical(out$kind, "dp_mean_test")) {
    return(invisible(plot_dp(x, out, ...)))
  }
  if (identical(type, "model")) return(invisible(plot_model(x, out, ...)))
  stop(sprintf(paste0("a %s output has no plot; plots exist for tables and histograms, DP ",
                      "answers, regressions, survival tables and trained models"), type),
       call. = FALSE)
}

Z95 <- stats::qnorm(0.975)

# The table's cells as a matrix: rows by the row variables' labels, columns by the frame's.
table_matrix <- function(x, out) {
  frame <- as.data.frame(x)
  labels <- unlist(out$row_vars)
  values <- frame[, setdiff(names(frame), labels), drop = FALSE]
  m <- as.matrix(values)
  storage.mode(m) <- "double"
  rownames(m) <- if (length(labels)) {
    do.call(paste, c(unname(as.list(frame[, labels, drop = FALSE])), sep = ", "))
  } else {
    rep("all", nrow(m))
  }
  m
}

plot_table <- function(x, out, ...) {
  m <- table_matrix(x, out)
  histogram <- identical(out$source, "histogram")
  what <- if (is.null(out$value)) "records" else out$value
  ylab <- sprintf("%s of %s", if (is.null(out$statistic)) "count" else out$statistic, what)
  main <- sprintf("step %d: %s", x$index, gsub("_", " ", out$source))
  if (histogram) {
    # Bins are the columns: one row of bars, or one series per by group.
    heights <- if (nrow(m) == 1) m[1, ] else m
    graphics::barplot(heights, beside = nrow(m) > 1, space = if (nrow(m) == 1) 0 else NULL,
                      legend.text = if (nrow(m) > 1) rownames(m), ylab = ylab, main = main,
                      xlab = if (is.null(out$variable)) "" else out$variable, ...)
  } else if (ncol(m) == 1) {
    graphics::barplot(m[, 1], names.arg = rownames(m), ylab = ylab, main = main, las = 2, ...)
  } else {
    graphics::barplot(t(m), beside = TRUE, legend.text = colnames(m), ylab = ylab, main = main,
                      las = 2, ...)
  }
  m
}

plot_survival <- function(x, out, ...) {
  curves <- lapply(out$curves, function(curve) {
    list(
      label = if (length(curve$labels)) paste(unlist(curve$labels), collapse = ", ") else "all",
      time = c(0, vapply(curve$steps, function(s) as.numeric(s$time), 0)),
      survival = c(1, vapply(curve$steps, function(s) as.numeric(s$survival), 0))
    )
  })
  xmax <- max(vapply(curves, function(c) max(c$time), 0))
  graphics::plot(NA, xlim = c(0, xmax), ylim = c(0, 1.05), xlab = out$time, ylab = "survival",
                 main = sprintf("step %d: Kaplan-Meier estimate", x$index), ...)
  for (i in seq_along(curves)) {
    graphics::lines(curves[[i]]$time, curves[[i]]$survival, type = "s", col = i, lwd = 2)
  }
  if (length(out$by)) {
    graphics::legend("topright", legend = vapply(curves, `[[`, "", "label"),
                     col = seq_along(curves), lwd = 2)
  }
  curves
}

plot_intervals <- function(est, low, high, labels, main, xlab, ...) {
  n <- length(est)
  if (!any(is.finite(est))) {
    stop("no estimate to draw: every one is missing (e.g. a noisy count that is not positive)",
         call. = FALSE)
  }
  # A missing estimate (a DP mean whose noisy count is not positive) is left out of the plot.
  graphics::plot(est, seq_len(n), xlim = range(c(low, high, 0), finite = TRUE), yaxt = "n", pch = 19,
                 xlab = xlab, ylab = "", main = main, ...)
  graphics::segments(low, seq_len(n), high, seq_len(n))
  graphics::abline(v = 0, col = "grey")
  graphics::axis(2, at = seq_len(n), labels = labels, las = 1)
  data.frame(term = labels, estimate = est, low = low, high = high, stringsAsFactors = FALSE)
}

plot_regression <- function(x, out, ...) {
  rows <- Filter(function(c) !identical(c$term, "Intercept"), out$coefficients)
  if (!length(rows)) rows <- out$coefficients
  est <- vapply(rows, function(c) as.numeric(c$estimate), 0)
  se <- vapply(rows, function(c) if (is.null(c$std_error)) 0 else as.numeric(c$std_error), 0)
  plot_intervals(est, est - Z95 * se, est + Z95 * se, vapply(rows, `[[`, "", "term"),
                 sprintf("step %d: %s %s", x$index, out$family, out$formula),
                 "estimate (95 % interval)", ...)
}

plot_dp <- function(x, out, ...) {
  frame <- as.data.frame(x)
  by <- unlist(out$by)
  components <- unlist(out$components)
  if (identical(out$kind, "dp_mean")) {
    half <- Z95 * frame$std_error
    return(plot_intervals(frame$mean, frame$mean - half, frame$mean + half,
                          do.call(paste, c(unname(as.list(frame[, c(by, "variable"), drop = FALSE])), sep = ", ")),
                          sprintf("step %d: dp_mean (noisy, 95 %% interval)", x$index),
                          "estimate", ...))
  }
  est <- as.matrix(frame[, components, drop = FALSE])
  se <- as.matrix(frame[, paste("se", components), drop = FALSE])
  labels <- if (length(by)) {
    do.call(paste, c(unname(as.list(frame[, by, drop = FALSE])), sep = ", "))
  } else {
    "all"
  }
  rownames(est) <- labels
  mids <- graphics::barplot(est, beside = TRUE, legend.text = if (length(by)) labels,
                            ylim = range(c(0, est + Z95 * se, est - Z95 * se), finite = TRUE),
                            main = sprintf("step %d: %s (noisy, 95 %% interval)", x$index, out$kind),
                            las = 2, ...)
  graphics::arrows(mids, est - Z95 * se, mids, est + Z95 * se, angle = 90, code = 3,
                   length = 0.03)
  data.frame(group = rep(labels, times = length(components)),
             component = rep(components, each = length(labels)),
             estimate = as.vector(est), low = as.vector(est - Z95 * se),
             high = as.vector(est + Z95 * se), stringsAsFactors = FALSE)
}

plot_model <- function(x, out, ...) {
  if (length(out$roc)) {
    fpr <- vapply(out$roc, function(p) as.numeric(p$fpr), 0)
    tpr <- vapply(out$roc, function(p) as.numeric(p$tpr), 0)
    graphics::plot(fpr, tpr, type = "o", xlim = c(0, 1), ylim = c(0, 1),
                   xlab = "false positive rate", ylab = "true positive rate",
                   main = sprintf("step %d: ROC of %s", x$index, out$family), ...)
    graphics::abline(0, 1, lty = 2, col = "grey")
    return(data.frame(fpr = fpr, tpr = tpr))
  }
  metrics <- unlist(Filter(Negate(is.null), out$metrics))
  graphics::barplot(metrics, ylim = c(0, 1), las = 2,
                    main = sprintf("step %d: %s test metrics (n = %d)", x$index, out$family,
                                   as.integer(out$n_test)), ...)
  metrics
}
