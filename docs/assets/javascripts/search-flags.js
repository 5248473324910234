/* Search finds flags. mkdocs-material's search worker hands the query to lunr, which reads a word that
   starts with "-" as "pages must NOT contain this", so searching "--gpu" or "--finetune" found nothing.
   The index splits "--gpu" into "gpu" (the search separator includes "-"), so the dashes in front of a
   word are dropped from a query on its way to the worker (a QUERY message, type 2, in material's
   search protocol). Nothing else changes: the box still shows what was typed. */
(function () {
  var post = Worker.prototype.postMessage;
  Worker.prototype.postMessage = function (message) {
    if (message && message.type === 2 && typeof message.data === "string") {
      message = Object.assign({}, message, { data: message.data.replace(/(^|\s)-+(?=[A-Za-z0-9])/g, "$1") });
    }
    var rest = Array.prototype.slice.call(arguments, 1);
    return post.apply(this, [message].concat(rest));
  };
})();
